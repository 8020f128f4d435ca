# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The steady loop's records straight through librdkafka (docs/design.md#the-hot-path):
read from the partition's own fetch queue and produced with rd_kafka_producev, on the very
clients confluent-kafka made, without a confluent-kafka Message or produce() call per record
(some 3.5 µs of Python each on this machine). Only the per-record steps move here: the
transactions, the group metadata, seeks and every error stay with confluent-kafka and
dedup/batch.py. An unusual record (an error, no key, a failed produce) goes back to batch.py
as a Record, which reads like a confluent-kafka Message.

librdkafka is the one confluent-kafka loaded (found in /proc/self/maps, opened RTLD_NOLOAD:
the same library instance, never a second copy), its functions looked up by name: the build
needs no librdkafka header and links nothing. The clients' rd_kafka_t comes from
confluent-kafka's object (the pointer after the object header, in every release since 1.0);
reader()/writer() check it (its type and its client.id) and return None when anything does
not match, and the loop then reads through confluent-kafka as before."""

import os

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Contains, PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsSsize_t
from cpython.set cimport PySet_Contains
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc

from eopipe.core.native cimport KeyPath, json_key, key_path

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError
from confluent_kafka.cimpl import Consumer, Producer

_CLIENTS = {EO_PRODUCER: Producer, EO_CONSUMER: Consumer}  # the C types, whatever subclasses them

cdef extern from *:
    """
    #include <dlfcn.h>
    #include <stdint.h>
    #include <sys/types.h>

    /* librdkafka's ABI, as its rdkafka.h declares it (stable since 1.0). */
    typedef struct rd_kafka_s rd_kafka_t;
    typedef struct rd_kafka_topic_s rd_kafka_topic_t;
    typedef struct rd_kafka_queue_s rd_kafka_queue_t;
    typedef struct rd_kafka_headers_s rd_kafka_headers_t;
    typedef struct {
        int err;
        rd_kafka_topic_t *rkt;
        int32_t partition;
        void *payload;
        size_t len;
        void *key;
        size_t key_len;
        int64_t offset;
        void *_private;
    } eo_message_t;

    enum { EO_VT_END = 0, EO_VT_RKT = 2, EO_VT_PARTITION = 3, EO_VT_VALUE = 4, EO_VT_KEY = 5,
           EO_VT_MSGFLAGS = 7, EO_VT_TIMESTAMP = 8, EO_VT_HEADERS = 10 };
    enum { EO_MSG_F_COPY = 0x2, EO_PRODUCER = 0, EO_CONSUMER = 1 };

    static struct {
        int loaded;
        int (*type)(const rd_kafka_t *);
        const char *(*name)(const rd_kafka_t *);
        rd_kafka_queue_t *(*queue_get_partition)(rd_kafka_t *, const char *, int32_t);
        void (*queue_forward)(rd_kafka_queue_t *, rd_kafka_queue_t *);
        void (*queue_destroy)(rd_kafka_queue_t *);
        ssize_t (*consume_batch_queue)(rd_kafka_queue_t *, int, eo_message_t **, size_t);
        void (*message_destroy)(eo_message_t *);
        int64_t (*message_timestamp)(const eo_message_t *, int *);
        int (*message_headers)(const eo_message_t *, rd_kafka_headers_t **);
        rd_kafka_headers_t *(*headers_copy)(const rd_kafka_headers_t *);
        void (*headers_destroy)(rd_kafka_headers_t *);
        int (*header_remove)(rd_kafka_headers_t *, const char *);
        size_t (*header_cnt)(const rd_kafka_headers_t *);
        int (*header_get_all)(const rd_kafka_headers_t *, size_t, const char **, const void **, size_t *);
        int (*producev)(rd_kafka_t *, ...);
        rd_kafka_topic_t *(*topic_new)(rd_kafka_t *, const char *, void *);
        void (*topic_destroy)(rd_kafka_topic_t *);
        const char *(*err2str)(int);
    } eo;

    #define EO_SYM(f, n) if (!(*(void **)&eo.f = dlsym(h, "rd_kafka_" n))) return n;

    /* NULL, or the name of what was missing. */
    static const char *eo_load(const char *path) {
        void *h;
        if (eo.loaded) return NULL;
        h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (!h) return "the loaded library";
        EO_SYM(type, "type") EO_SYM(name, "name")
        EO_SYM(queue_get_partition, "queue_get_partition") EO_SYM(queue_forward, "queue_forward")
        EO_SYM(queue_destroy, "queue_destroy") EO_SYM(consume_batch_queue, "consume_batch_queue")
        EO_SYM(message_destroy, "message_destroy") EO_SYM(message_timestamp, "message_timestamp")
        EO_SYM(message_headers, "message_headers") EO_SYM(headers_copy, "headers_copy")
        EO_SYM(headers_destroy, "headers_destroy") EO_SYM(header_remove, "header_remove")
        EO_SYM(header_cnt, "header_cnt") EO_SYM(header_get_all, "header_get_all")
        EO_SYM(producev, "producev") EO_SYM(err2str, "err2str")
        EO_SYM(topic_new, "topic_new") EO_SYM(topic_destroy, "topic_destroy")
        eo.loaded = 1;
        return NULL;
    }

    /* confluent-kafka's client object: its PyObject header, then the rd_kafka_t. */
    typedef struct { PyObject_HEAD rd_kafka_t *rk; } eo_handle_t;
    static rd_kafka_t *eo_rk(PyObject *client) { return ((eo_handle_t *)client)->rk; }

    /* As confluent-kafka's produce(topic, value, key, partition, timestamp=, headers=) calls it.
       The headers are the producer's on success only. */
    static int eo_produce(rd_kafka_t *rk, rd_kafka_topic_t *rkt, int32_t partition, const eo_message_t *m,
                          int64_t ts, rd_kafka_headers_t *hdrs) {
        if (hdrs)
            return eo.producev(rk, EO_VT_RKT, rkt, EO_VT_PARTITION, partition, EO_VT_VALUE, m->payload, m->len,
                               EO_VT_KEY, m->key, m->key_len, EO_VT_MSGFLAGS, EO_MSG_F_COPY, EO_VT_TIMESTAMP, ts,
                               EO_VT_HEADERS, hdrs, EO_VT_END);
        return eo.producev(rk, EO_VT_RKT, rkt, EO_VT_PARTITION, partition, EO_VT_VALUE, m->payload, m->len,
                           EO_VT_KEY, m->key, m->key_len, EO_VT_MSGFLAGS, EO_MSG_F_COPY, EO_VT_TIMESTAMP, ts,
                           EO_VT_END);
    }
    """
    ctypedef struct rd_kafka_t
    ctypedef struct rd_kafka_topic_t
    ctypedef struct rd_kafka_queue_t
    ctypedef struct rd_kafka_headers_t
    ctypedef struct eo_message_t:
        int err
        int32_t partition
        void *payload
        size_t len
        void *key
        size_t key_len
        int64_t offset
    int EO_PRODUCER, EO_CONSUMER
    const char *eo_load(const char *path)
    rd_kafka_t *eo_rk(object client)
    int eo_produce(rd_kafka_t *rk, rd_kafka_topic_t *rkt, int32_t partition, const eo_message_t *m, int64_t ts,
                   rd_kafka_headers_t *hdrs) nogil
    rd_kafka_topic_t *eo_topic_new "eo.topic_new"(rd_kafka_t *, const char *, void *)
    void eo_topic_destroy "eo.topic_destroy"(rd_kafka_topic_t *)
    int eo_type "eo.type"(const rd_kafka_t *)
    const char *eo_name "eo.name"(const rd_kafka_t *)
    rd_kafka_queue_t *eo_queue_get_partition "eo.queue_get_partition"(rd_kafka_t *, const char *, int32_t)
    void eo_queue_forward "eo.queue_forward"(rd_kafka_queue_t *, rd_kafka_queue_t *)
    void eo_queue_destroy "eo.queue_destroy"(rd_kafka_queue_t *)
    Py_ssize_t eo_consume "eo.consume_batch_queue"(rd_kafka_queue_t *, int, eo_message_t **, size_t) nogil
    void eo_message_destroy "eo.message_destroy"(eo_message_t *) nogil
    int64_t eo_message_timestamp "eo.message_timestamp"(const eo_message_t *, int *)
    int eo_message_headers "eo.message_headers"(const eo_message_t *, rd_kafka_headers_t **)
    rd_kafka_headers_t *eo_headers_copy "eo.headers_copy"(const rd_kafka_headers_t *)
    void eo_headers_destroy "eo.headers_destroy"(rd_kafka_headers_t *)
    int eo_header_remove "eo.header_remove"(rd_kafka_headers_t *, const char *)
    size_t eo_header_cnt "eo.header_cnt"(const rd_kafka_headers_t *)
    int eo_header_get_all "eo.header_get_all"(const rd_kafka_headers_t *, size_t, const char **, const void **,
                                              size_t *)
    const char *eo_err2str "eo.err2str"(int)


_unavailable: str | None = "not loaded yet"


def _library() -> str | None:
    """The path of the librdkafka this process loaded (confluent-kafka's, imported above), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)  # address perms offset dev inode path
            if len(fields) == 6 and "librdkafka" in os.path.basename(fields[5].strip()):
                return fields[5].strip()
    return None


def unavailable() -> str | None:
    """None when the direct path can run in this process; else why not."""
    global _unavailable
    if _unavailable == "not loaded yet":
        try:
            path = _library()
        except OSError as e:
            path, _unavailable = None, f"/proc/self/maps: {e}"
        if path is not None:
            missing = eo_load(path.encode())
            _unavailable = None if missing == NULL else f"{path} has no rd_kafka_{missing.decode()}"
        elif _unavailable == "not loaded yet":
            _unavailable = "no librdkafka among the loaded libraries"
    return _unavailable


cdef rd_kafka_t *_handle(object client, int kind, str client_id) except? NULL:
    """The client's rd_kafka_t, when it is one of `kind` named by `client_id`; else NULL."""
    if unavailable() is not None or not isinstance(client, _CLIENTS[kind]):
        return NULL
    cdef rd_kafka_t *rk = eo_rk(client)
    if rk == NULL or eo_type(rk) != kind:
        return NULL
    if not (<bytes>eo_name(rk)).decode(errors="replace").startswith(client_id + "#"):
        return NULL
    return rk


def reader(consumer, str client_id, str topic, int partition):
    """A Reader of `partition` through `consumer` (a confluent-kafka Consumer whose client.id is
    `client_id`), or None where the direct path cannot run. From now on the partition's records
    stay in its own queue: only the Reader sees them (the consumer's own consume() no longer
    does), until the Reader is closed; seek the partition after this, so nothing already moved
    to the consumer's queue is read (the seek outdates it)."""
    cdef rd_kafka_t *rk = _handle(consumer, EO_CONSUMER, client_id)
    if rk == NULL:
        return None
    cdef rd_kafka_queue_t *q = eo_queue_get_partition(rk, topic.encode(), partition)
    if q == NULL:
        return None
    # Unforwarded by the application: librdkafka's (re)assignments leave it so.
    eo_queue_forward(q, NULL)
    r = Reader()
    r.q = q
    return r


cdef class Reader:
    cdef rd_kafka_queue_t *q

    def read(self, Py_ssize_t want, double timeout, bint first_only=False):
        """Up to `want` records as a Batch (None: none): waiting up to `timeout` seconds for all
        of them, or (`first_only`) for the first, then taking what is already fetched."""
        if self.q == NULL:
            raise RuntimeError("the reader is closed")
        if want < 1:
            return None
        cdef eo_message_t **msgs = <eo_message_t **>malloc(want * sizeof(eo_message_t *))
        if msgs == NULL:
            raise MemoryError()
        cdef int ms = <int>(timeout * 1000)
        cdef Py_ssize_t n, more
        with nogil:
            n = eo_consume(self.q, ms, msgs, 1 if first_only else want)
            if first_only and n == 1 and want > 1:
                more = eo_consume(self.q, 0, msgs + 1, want - 1)
                if more > 0:
                    n += more
        if n <= 0:
            free(msgs)
            return None
        b = Batch()
        b.msgs, b.n = msgs, n
        return b

    def close(self) -> None:
        """Before the consumer closes (librdkafka requires it)."""
        if self.q != NULL:
            eo_queue_destroy(self.q)
            self.q = NULL

    def __dealloc__(self):
        self.close()


def writer(producer, str client_id):
    """A Writer for `producer` (a confluent-kafka Producer whose client.id is `client_id`), or
    None where the direct path cannot run."""
    cdef rd_kafka_t *rk = _handle(producer, EO_PRODUCER, client_id)
    if rk == NULL:
        return None
    w = Writer()
    w.producer, w.rk = producer, rk
    return w


cdef class Writer:
    cdef object producer  # keeps the rd_kafka_t alive
    cdef rd_kafka_t *rk
    cdef str topic        # the topic of `rkt`, a handle kept: not looked up for every record
    cdef rd_kafka_topic_t *rkt

    cdef rd_kafka_topic_t *handle(self, str topic) except NULL:
        if self.rk == NULL:
            raise RuntimeError("the writer is closed")
        if self.rkt == NULL or topic != self.topic:
            self.close()
            self.rkt = eo_topic_new(self.rk, topic.encode(), NULL)
            if self.rkt == NULL:
                raise ValueError(f"no topic handle for {topic!r}")
            self.topic = topic
        return self.rkt

    def close(self) -> None:
        """Before the producer closes."""
        if self.rkt != NULL:
            eo_topic_destroy(self.rkt)
            self.rkt = NULL

    def __dealloc__(self):
        self.close()


cdef class Batch:
    """Records read, owned until free(); good and the like are indexes into it."""
    cdef eo_message_t **msgs
    cdef Py_ssize_t n

    def __len__(self):
        return self.n

    def split(self, bint by_key):
        """As core/native.split, by index: (the good ones, their keys (by_key: the record keys;
        else empty), the odd ones as Records, the offset after the last record without an
        error or -1)."""
        cdef list good = [], keys = [], odd = []
        cdef Py_ssize_t i
        cdef int64_t end = -1
        cdef eo_message_t *m
        for i in range(self.n):
            m = self.msgs[i]
            if m.err != 0:
                odd.append(self.record(i))
                continue
            end = m.offset + 1
            if by_key:
                if m.key == NULL or m.key_len == 0:
                    odd.append(self.record(i))
                    continue
                keys.append(PyBytes_FromStringAndSize(<const char *>m.key, m.key_len))
            good.append(i)
        return good, keys, odd, end

    def values(self, list idx):
        """The values of records `idx` (None for none)."""
        cdef Py_ssize_t j, n = PyList_GET_SIZE(idx)
        cdef list out = [None] * n
        cdef eo_message_t *m
        for j in range(n):
            m = self.msgs[self._at(<object>PyList_GET_ITEM(idx, j))]
            if m.payload != NULL:
                out[j] = PyBytes_FromStringAndSize(<const char *>m.payload, m.len)
        return out

    def json_keys(self, list idx, tuple path):
        """core/native.json_keys of records `idx`, scanned where librdkafka holds them."""
        cdef KeyPath kp
        cdef list keep = []
        if key_path(path, keep, &kp) != 0:
            return None
        cdef Py_ssize_t j, n = PyList_GET_SIZE(idx)
        cdef list out = [None] * n
        cdef eo_message_t *m
        cdef object k
        for j in range(n):
            m = self.msgs[self._at(<object>PyList_GET_ITEM(idx, j))]
            if m.payload == NULL:
                return None
            k = json_key(<const unsigned char *>m.payload, m.len, &kp)
            if k is None:
                return None
            out[j] = k
        return out

    cdef inline Py_ssize_t _at(self, object i) except -1:
        cdef Py_ssize_t k = PyLong_AsSsize_t(i)
        if k < 0 or k >= self.n or self.msgs == NULL:
            raise IndexError(f"record {k} of {self.n}")
        return k

    def record(self, i):
        """Record `i`, copied out: it outlives the batch."""
        cdef eo_message_t *m = self.msgs[self._at(i)]
        cdef int tstype = 0
        cdef int64_t ts = eo_message_timestamp(m, &tstype)
        r = Record()
        r._partition, r._offset = m.partition, m.offset
        r._timestamp = (tstype, ts)
        if m.err != 0:
            reason = PyBytes_FromStringAndSize(<const char *>m.payload, m.len).decode(errors="replace") \
                if m.payload != NULL else (<bytes>eo_err2str(m.err)).decode()
            r._error = KafkaError(m.err, reason)
            return r
        r._key = PyBytes_FromStringAndSize(<const char *>m.key, m.key_len) if m.key != NULL else None
        r._value = PyBytes_FromStringAndSize(<const char *>m.payload, m.len) if m.payload != NULL else None
        r._headers = _headers(m)
        return r

    def emit(self, list good, list keys, Py_ssize_t start, dict pending, set seen, bint broken, Writer w,
             str out, int out_p, str rerouted):
        """core/native.emit by index, produced by `w` straight through librdkafka: returns
        (where it stopped, emitted, duplicates); it stops at the end or at a record whose produce
        failed, which the caller then sends itself (and sees the error)."""
        cdef Py_ssize_t i, n = PyList_GET_SIZE(good), emitted = 0, dups = 0
        cdef object k
        cdef eo_message_t *m
        cdef int tstype = 0, err
        cdef int64_t ts
        cdef rd_kafka_headers_t *src
        cdef rd_kafka_headers_t *hdrs
        cdef bint check_seen = len(seen) > 0
        cdef rd_kafka_topic_t *rkt = w.handle(out)
        cdef bytes drop = rerouted.encode()
        for i in range(start, n):
            m = self.msgs[self._at(<object>PyList_GET_ITEM(good, i))]
            k = <object>PyList_GET_ITEM(keys, i)
            if not broken and (PyDict_Contains(pending, k) or (check_seen and PySet_Contains(seen, k))):
                dups += 1
                continue
            ts = eo_message_timestamp(m, &tstype)
            if tstype == TIMESTAMP_NOT_AVAILABLE:
                ts = 0
            PyDict_SetItem(pending, k, ts)  # before the produce: the caller reads it if it fails
            hdrs = NULL
            if eo_message_headers(m, &src) == 0:
                hdrs = eo_headers_copy(src)
                eo_header_remove(hdrs, drop)
                if eo_header_cnt(hdrs) == 0:
                    eo_headers_destroy(hdrs)
                    hdrs = NULL
            err = eo_produce(w.rk, rkt, out_p, m, ts, hdrs)
            if err != 0:
                if hdrs != NULL:
                    eo_headers_destroy(hdrs)
                return i, emitted, dups
            emitted += 1
        return n, emitted, dups

    def free(self) -> None:
        """Gives the records back to librdkafka: before the consumer closes."""
        cdef Py_ssize_t i
        if self.msgs != NULL:
            for i in range(self.n):
                eo_message_destroy(self.msgs[i])
            free(self.msgs)
            self.msgs = NULL

    def __dealloc__(self):
        self.free()


cdef object _headers(eo_message_t *m):
    cdef rd_kafka_headers_t *hdrs
    cdef const char *name
    cdef const void *val
    cdef size_t size, i
    if eo_message_headers(m, &hdrs) != 0:
        return None
    out = []
    for i in range(eo_header_cnt(hdrs)):
        if eo_header_get_all(hdrs, i, &name, &val, &size) != 0:
            break
        out.append(((<bytes>name).decode(errors="replace"),
                    PyBytes_FromStringAndSize(<const char *>val, size) if val != NULL else None))
    return out or None


cdef class Record:
    """A record read by a Reader, copied out, read as a confluent-kafka Message is."""
    cdef object _key, _value, _headers, _error, _timestamp
    cdef int32_t _partition
    cdef int64_t _offset

    def key(self):
        return self._key

    def value(self):
        return self._value

    def headers(self):
        return self._headers

    def error(self):
        return self._error

    def timestamp(self):
        return self._timestamp

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset
