// The broker's requests so far, by type: one "<type> <count>" line per kafka.network
// RequestsPerSec meter (its Count; one per request version). Read through the JVM's local
// attach, so the broker needs no JMX port. Run by bench/pipeline_rate.py as
// `java bench/BrokerRequests.java <broker pid>` (Java's single-file launch: nothing to build).
import com.sun.tools.attach.VirtualMachine;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerRequests {
    public static void main(String[] args) throws Exception {
        VirtualMachine vm = VirtualMachine.attach(args[0]);
        String address;
        try {
            address = vm.startLocalManagementAgent();
        } finally {
            vm.detach();
        }
        try (JMXConnector connector = JMXConnectorFactory.connect(new JMXServiceURL(address))) {
            MBeanServerConnection server = connector.getMBeanServerConnection();
            ObjectName meters = new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*");
            for (ObjectName name : server.queryNames(meters, null)) {
                System.out.println(name.getKeyProperty("request") + " " + server.getAttribute(name, "Count"));
            }
        }
    }
}
