package dev.eopipe.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * Kafka Streams dedup, exactly_once_v2, the structure of the Kafka Streams dedup tutorial
 * ("How to find distinct values"): a persistent (RocksDB) window store of the ids seen, keyed by
 * the JSON field `id` of the value (parsed with Jackson); a processor that forwards a record
 * only when its id has no entry within the window around the record's timestamp and refreshes
 * the entry of a duplicate so it does not expire. The store is changelogged (the default), as
 * exactly-once needs to restore it. Records without an id are forwarded as they are.
 * processValues keeps the record key, so nothing is repartitioned: input partition = output
 * partition, as eopipe's worker does.
 */
final class StreamsDedup {
    static final String STORE = "seen-ids";

    private StreamsDedup() {
    }

    static void run(Peer peer) throws Exception {
        long windowMs = Long.parseLong(peer.args.getOrDefault("window-ms", String.valueOf(24 * 3600 * 1000L)));
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, peer.group);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, peer.bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, peer.args.getOrDefault("threads", "1"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, peer.need("state-dir"));
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        StreamsConfig effective = new StreamsConfig(p);
        var shown = Peer.asMap(p);
        shown.put("window.ms", windowMs);
        shown.put("store", "persistentWindowStore(" + STORE + ", retention=window, size=window, changelogged)");
        for (String k : new String[] {StreamsConfig.COMMIT_INTERVAL_MS_CONFIG,
                StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, StreamsConfig.REPLICATION_FACTOR_CONFIG}) {
            shown.put(k + " (effective)", effective.values().get(k));
        }
        peer.printConfig("kafka streams dedup", shown);

        StreamsBuilder builder = new StreamsBuilder();
        StoreBuilder<WindowStore<String, Long>> store = Stores.windowStoreBuilder(
                Stores.persistentWindowStore(STORE, Duration.ofMillis(windowMs), Duration.ofMillis(windowMs), false),
                Serdes.String(), Serdes.Long());
        builder.addStateStore(store);
        builder.stream(peer.source, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .processValues(() -> new Dedup(peer, windowMs), STORE)
                .to(peer.output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));

        CountDownLatch stopped = new CountDownLatch(1);
        try (KafkaStreams streams = new KafkaStreams(builder.build(), p)) {
            streams.setUncaughtExceptionHandler(e -> {
                e.printStackTrace();
                stopped.countDown();
                return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                        .SHUTDOWN_CLIENT;
            });
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                stopped.countDown();
                streams.close(Duration.ofSeconds(30));
            }));
            streams.start();
            while (!peer.done() && !stopped.await(50, TimeUnit.MILLISECONDS)) {
                // the processor counts; close() below commits what it forwarded
            }
            streams.close(Duration.ofSeconds(60));
            if (streams.state() == KafkaStreams.State.ERROR) {
                throw new IllegalStateException("kafka streams failed");
            }
        }
    }

    /** Forwards first sightings of an id within the window; remembers every id it forwards. */
    static final class Dedup implements FixedKeyProcessor<byte[], byte[], byte[]> {
        private static final ObjectMapper JSON = new ObjectMapper();
        private final Peer peer;
        private final long windowMs;
        private FixedKeyProcessorContext<byte[], byte[]> context;
        private WindowStore<String, Long> seen;

        Dedup(Peer peer, long windowMs) {
            this.peer = peer;
            this.windowMs = windowMs;
        }

        @Override
        public void init(FixedKeyProcessorContext<byte[], byte[]> context) {
            this.context = context;
            this.seen = context.getStateStore(STORE);
        }

        @Override
        public void process(FixedKeyRecord<byte[], byte[]> record) {
            peer.consumedRecords(1);
            String id = idOf(record.value());
            if (id == null) {
                context.forward(record);
                return;
            }
            long ts = record.timestamp();
            boolean duplicate;
            try (WindowStoreIterator<Long> it = seen.fetch(id, ts - windowMs, ts + windowMs)) {
                duplicate = it.hasNext();
            }
            seen.put(id, ts, ts);  // a duplicate refreshes its entry so it does not expire
            if (!duplicate) {
                context.forward(record);
            }
        }

        private static String idOf(byte[] value) {
            if (value == null) {
                return null;
            }
            try {
                JsonNode id = JSON.readTree(value).get("id");
                return id == null || id.isNull() ? null : id.asText();
            } catch (IOException e) {
                return null;
            }
        }
    }
}
