// Prints, for each hex-encoded key on stdin, Kafka's Java murmur2 and the default partition
// for the partition count given as the first argument. Used to check eopipe.partitioner.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.HexFormat;
import org.apache.kafka.common.utils.Utils;

public class KafkaPartition {
    public static void main(String[] args) throws Exception {
        int partitions = Integer.parseInt(args[0]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            byte[] key = HexFormat.of().parseHex(line.trim());
            int h = Utils.murmur2(key);
            System.out.println(h + " " + Utils.toPositive(h) % partitions);
        }
    }
}
