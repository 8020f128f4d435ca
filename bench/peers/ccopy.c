/* The plain copier of bench/copier.py in C, on the librdkafka the confluent-kafka wheel bundles:
 * the same settings and loop (a batch consumed, each record produced with its key, value,
 * headers, timestamp and partition, the producer flushed, the offsets committed), so its CPU per
 * record is the client library's own and the Python copier's excess over it is Python's.
 * Built by bench/contestants.py (c_copier). Usage: ccopy BOOTSTRAP SOURCE OUTPUT GROUP */
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#define BATCH 5000

static volatile sig_atomic_t stop;

static void on_term(int sig) { (void)sig; stop = 1; }

static rd_kafka_t *client(rd_kafka_type_t type, const char *const *conf) {
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    for (; *conf; conf += 2)
        if (rd_kafka_conf_set(c, conf[0], conf[1], err, sizeof err) != RD_KAFKA_CONF_OK) {
            fprintf(stderr, "ccopy: %s\n", err);
            exit(2);
        }
    rd_kafka_t *rk = rd_kafka_new(type, c, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "ccopy: %s\n", err);
        exit(1);
    }
    return rk;
}

/* One record to the output; waits while the producer's queue is full, as the Python copier does. */
static void copy(rd_kafka_t *p, const char *topic, const rd_kafka_message_t *m) {
    rd_kafka_headers_t *h = NULL;
    if (rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR)
        h = rd_kafka_headers_copy(h);  /* the producer owns the copy once produced */
    for (;;) {
        rd_kafka_resp_err_t e = rd_kafka_producev(
            p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(m->partition),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(m->key, m->key_len),
            RD_KAFKA_V_VALUE(m->payload, m->len), RD_KAFKA_V_TIMESTAMP(rd_kafka_message_timestamp(m, NULL)),
            RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
            return;
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            fprintf(stderr, "ccopy: produce: %s\n", rd_kafka_err2str(e));
            exit(1);
        }
        rd_kafka_poll(p, 50);
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: ccopy BOOTSTRAP SOURCE OUTPUT GROUP\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    const char *cconf[] = {"bootstrap.servers", argv[1], "group.id", argv[4], "enable.auto.commit", "false",
                           "auto.offset.reset", "earliest", "fetch.queue.backoff.ms", "10", NULL};
    const char *pconf[] = {"bootstrap.servers", argv[1], "linger.ms", "5", "enable.idempotence", "true", NULL};
    rd_kafka_t *c = client(RD_KAFKA_CONSUMER, cconf), *p = client(RD_KAFKA_PRODUCER, pconf);
    rd_kafka_poll_set_consumer(c);
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, argv[2], RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(c, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    rd_kafka_queue_t *q = rd_kafka_queue_get_consumer(c);
    static rd_kafka_message_t *batch[BATCH];
    while (!stop) {
        ssize_t n = rd_kafka_consume_batch_queue(q, 100, batch, BATCH);
        if (n <= 0)
            continue;
        for (ssize_t i = 0; i < n; i++) {
            if (!batch[i]->err)
                copy(p, argv[3], batch[i]);
            rd_kafka_message_destroy(batch[i]);
        }
        rd_kafka_flush(p, 60000);
        rd_kafka_commit(c, NULL, 0);
    }
    rd_kafka_queue_destroy(q);
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    rd_kafka_destroy(p);
    return 0;
}
