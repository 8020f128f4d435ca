package dev.eopipe.bench;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Consume -> produce copiers, no dedup: the ceilings eopipe's dedup is compared with.
 *
 * transactional: a read_committed consumer and a transactional producer; every poll's records
 * and the consumer's offsets (sendOffsetsToTransaction) commit in one transaction, the
 * exactly-once ceiling without dedup. plain: produce, flush, commitSync (at-least-once), the
 * broker's ceiling. Same record (key, value, headers, timestamp, partition) in both; the batch
 * and linger match bench/copier.py (5000 records a poll, linger 5 ms, 1 MB batches as
 * librdkafka's default).
 */
final class Copier {
    private Copier() {
    }

    static void run(Peer peer, boolean transactional) throws Exception {
        Properties cc = new Properties();
        cc.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, peer.bootstrap);
        cc.put(ConsumerConfig.GROUP_ID_CONFIG, peer.group);
        cc.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cc.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cc.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        cc.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, transactional ? "read_committed" : "read_uncommitted");
        Properties pc = new Properties();
        pc.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, peer.bootstrap);
        pc.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        pc.put(ProducerConfig.BATCH_SIZE_CONFIG, String.valueOf(1 << 20));
        pc.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        pc.put(ProducerConfig.ACKS_CONFIG, "all");
        if (transactional) {
            pc.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, peer.group + "-tx");
        }
        Map<String, Object> shown = new HashMap<>();
        Peer.asMap(cc).forEach((k, v) -> shown.put("consumer." + k, v));
        Peer.asMap(pc).forEach((k, v) -> shown.put("producer." + k, v));
        peer.printConfig(transactional ? "java transactional copier" : "java plain copier", shown);

        var deser = new ByteArrayDeserializer();
        var ser = new ByteArraySerializer();
        CountDownLatch finished = new CountDownLatch(1);
        Thread main = Thread.currentThread();
        try (var consumer = new KafkaConsumer<>(cc, deser, deser);
             var producer = new KafkaProducer<>(pc, ser, ser)) {
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                consumer.wakeup();
                try {
                    finished.await();
                } catch (InterruptedException e) {
                    main.interrupt();
                }
            }));
            if (transactional) {
                producer.initTransactions();
            }
            consumer.subscribe(List.of(peer.source));
            try {
                while (!peer.done()) {
                    ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
                    if (records.isEmpty()) {
                        continue;
                    }
                    Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                    if (transactional) {
                        producer.beginTransaction();
                    }
                    for (ConsumerRecord<byte[], byte[]> r : records) {
                        producer.send(new ProducerRecord<>(peer.output, r.partition(), r.timestamp(), r.key(),
                                r.value(), r.headers()));
                        offsets.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    }
                    if (transactional) {
                        producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                        producer.commitTransaction();
                    } else {
                        producer.flush();
                        consumer.commitSync(offsets);
                    }
                    peer.consumedRecords(records.count());
                }
            } catch (org.apache.kafka.common.errors.WakeupException e) {
                // SIGTERM: the last poll's records were committed or never sent; stop here.
            }
        } finally {
            finished.countDown();
        }
    }
}
