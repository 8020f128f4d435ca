package dev.eopipe.bench;

import java.lang.management.ManagementFactory;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The Java peers of `make bench` (bench/peers.py runs them):
 *
 *   java -cp JAR dev.eopipe.bench.Peer streams-dedup|tx-copy|plain-copy --bootstrap HOST:PORT
 *        --source TOPIC --output TOPIC --group ID [--expect N] [--idle-ms MS] [--threads N]
 *        [--window-ms MS] [--state-dir DIR]
 *
 * Each prints its configuration (lines starting "config ") before it starts, and exits 0 once
 * it has consumed and committed --expect records, or after --idle-ms without a record; else it
 * runs until SIGTERM (then it commits what it has and exits 0).
 */
public final class Peer {
    final Map<String, String> args;
    final String bootstrap, source, output, group;
    final long expect, idleMs;
    final AtomicLong consumed = new AtomicLong();
    private volatile long lastRecordNanos = System.nanoTime();

    Peer(Map<String, String> args) {
        this.args = args;
        bootstrap = need("bootstrap");
        source = need("source");
        output = need("output");
        group = need("group");
        expect = Long.parseLong(args.getOrDefault("expect", "0"));
        idleMs = Long.parseLong(args.getOrDefault("idle-ms", "0"));
    }

    String need(String name) {
        String v = args.get(name);
        if (v == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return v;
    }

    void consumedRecords(int n) {
        consumed.addAndGet(n);
        lastRecordNanos = System.nanoTime();
    }

    /** True once --expect records were consumed or nothing came for --idle-ms. */
    boolean done() {
        if (expect > 0 && consumed.get() >= expect) {
            return true;
        }
        return idleMs > 0 && (System.nanoTime() - lastRecordNanos) / 1_000_000 >= idleMs;
    }

    void printConfig(String contestant, Map<String, ?> settings) {
        Map<String, Object> all = new TreeMap<>(settings);
        all.put("contestant", contestant);
        all.put("expect", expect);
        all.put("idle.ms", idleMs);
        all.put("jvm.version", Runtime.version().toString());
        all.put("jvm.max.heap.mb", Runtime.getRuntime().maxMemory() >> 20);
        all.put("jvm.args", String.join(" ", ManagementFactory.getRuntimeMXBean().getInputArguments()));
        all.put("cpus", Runtime.getRuntime().availableProcessors());
        all.forEach((k, v) -> System.out.println("config " + k + "=" + v));
        System.out.flush();
    }

    static Map<String, Object> asMap(Properties p) {
        Map<String, Object> m = new HashMap<>();
        p.forEach((k, v) -> m.put(String.valueOf(k), v));
        return m;
    }

    public static void main(String[] argv) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        if (argv.length == 0 || argv.length % 2 == 0) {
            usage("expected: streams-dedup|tx-copy|plain-copy --name value ...");
        }
        Map<String, String> args = new HashMap<>();
        for (int i = 1; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                usage("expected an option, got " + argv[i]);
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        Peer peer;
        try {
            peer = new Peer(args);
        } catch (IllegalArgumentException e) {
            usage(e.getMessage());
            return;
        }
        switch (argv[0]) {
            case "streams-dedup" -> StreamsDedup.run(peer);
            case "tx-copy" -> Copier.run(peer, true);
            case "plain-copy" -> Copier.run(peer, false);
            default -> usage("unknown peer " + argv[0]);
        }
        System.out.println("done consumed=" + peer.consumed.get());
        System.out.flush();
    }

    static void usage(String why) {
        System.err.println("peer: " + why);
        System.exit(2);
    }
}
