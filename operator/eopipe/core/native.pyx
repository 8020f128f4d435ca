# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The per-record steps of the dedup loop, compiled (docs/design.md#the-hot-path): a loop of
C calls where Python would run some twenty bytecodes per record. Nothing here decides what
dedup/batch.py does not say: an unusual record (an error, no key, a failed produce) goes back
to batch.py, which handles it; murmur2 is core/partitioner.py's, which the tests compare."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Contains, PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.set cimport PySet_Contains
from cpython.object cimport PyObject
from libc.stdint cimport uint32_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcmp

from confluent_kafka import KafkaException, Message

# Unbound methods: one C call per record each, no attribute lookup or bound method.
_error = Message.error
_key = Message.key
_value = Message.value
_timestamp = Message.timestamp
_headers = Message.headers


def split(list msgs, bint by_key):
    """(the records, their keys (by_key: the record keys; else an empty list), the odd ones,
    the last record without an error or None): the odd ones, in order, carry an error or
    (by_key) no key; the caller handles them."""
    cdef list good = [], keys = [], odd = []
    cdef Py_ssize_t i, n = PyList_GET_SIZE(msgs)
    cdef object m, k, last = None
    for i in range(n):
        m = <object>PyList_GET_ITEM(msgs, i)
        if _error(m) is not None:
            odd.append(m)
            continue
        last = m
        if by_key:
            k = _key(m)
            if not k:
                odd.append(m)
                continue
            keys.append(k)
        good.append(m)
    return good, keys, odd, last


cdef inline uint32_t _murmur2(const unsigned char *data, Py_ssize_t length) noexcept nogil:
    # Kafka's Utils.murmur2 (seed 0x9747b28c), the producers' keyed partitioner.
    cdef uint32_t m = 0x5BD1E995U, h = 0x9747B28CU ^ <uint32_t>length, k
    cdef Py_ssize_t i, n4 = length >> 2, tail, rest
    for i in range(n4):
        k = (<uint32_t>data[4 * i] | (<uint32_t>data[4 * i + 1] << 8) | (<uint32_t>data[4 * i + 2] << 16)
             | (<uint32_t>data[4 * i + 3] << 24))
        k *= m
        k ^= k >> 24
        k *= m
        h *= m
        h ^= k
    tail = n4 << 2
    rest = length & 3
    if rest == 3:
        h ^= <uint32_t>data[tail + 2] << 16
    if rest >= 2:
        h ^= <uint32_t>data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return h


cpdef int murmur2_partition(bytes key, int partitions) except? -1:
    """(murmur2(key) & 0x7fffffff) % partitions: Java's toPositive, then the modulo."""
    return (_murmur2(<const unsigned char *>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)) & 0x7FFFFFFF) % partitions


def murmur2_partitions(list keys, int partitions):
    """[murmur2_partition(k, partitions) for k in keys]."""
    cdef Py_ssize_t i, n = PyList_GET_SIZE(keys)
    cdef list out = [0] * n
    cdef object k
    for i in range(n):
        k = <object>PyList_GET_ITEM(keys, i)
        if type(k) is not bytes:
            raise TypeError(f"a key is {type(k).__name__}, not bytes")
        out[i] = murmur2_partition(k, partitions)
    return out


cpdef object output_headers(object hdrs, str rerouted):
    """A record's headers as they go out: without the internal reroute mark; None for none."""
    if not hdrs:
        return hdrs
    return [h for h in hdrs if h[0] != rerouted] or None


def emit(list good, list keys, Py_ssize_t start, dict pending, set seen, bint broken, produce, str out,
         int out_p, str rerouted):
    """batch.py's emit loop from record `start`: a key in `pending` or `seen` is a duplicate;
    else pending[key] = its timestamp and the record goes to `out` (partition out_p), its
    headers without `rerouted`. Returns (where it stopped, emitted, duplicates): it stops at
    the end, or at a record whose produce raised, which the caller then sends itself."""
    cdef Py_ssize_t i, n = PyList_GET_SIZE(good)
    cdef Py_ssize_t emitted = 0, dups = 0
    cdef object m, k, ts, hdrs
    cdef tuple tt
    cdef bint check_seen = len(seen) > 0
    for i in range(start, n):
        m = <object>PyList_GET_ITEM(good, i)
        k = <object>PyList_GET_ITEM(keys, i)
        if not broken and (PyDict_Contains(pending, k) or (check_seen and PySet_Contains(seen, k))):
            dups += 1
            continue
        tt = <tuple>_timestamp(m)
        ts = tt[1] if tt[0] != 0 else 0  # TIMESTAMP_NOT_AVAILABLE
        PyDict_SetItem(pending, k, ts)
        hdrs = output_headers(_headers(m), rerouted)
        try:  # positional (topic, value, key, partition, callback, on_delivery, timestamp,
            # headers): parsing keywords cost 0.4 µs a call
            produce(out, _value(m), _key(m), out_p, None, None, ts, hdrs)
        except (BufferError, KafkaException):
            return i, emitted, dups
        emitted += 1
    return n, emitted, dups


# -- JSON dedup keys --------------------------------------------------------------------------
# A validating scan of the whole value, without building it: the key of a record is the field
# at `path` when it is a non-empty string without escapes, or an integer; the scan gives up
# (-1) on anything else, and core/keys.py then reads the value as before. Giving up is always
# safe; what the scan accepts is what the standard library's json reads, and it reads it alike.

cdef enum:
    MAX_DEPTH = 64

cdef struct Scan:
    const unsigned char *s
    Py_ssize_t n
    Py_ssize_t i
    Py_ssize_t key_start   # the field found: its text [key_start, key_end); -1: none (yet)
    Py_ssize_t key_end


cdef inline void _ws(Scan *sc) noexcept nogil:
    cdef unsigned char c
    while sc.i < sc.n:
        c = sc.s[sc.i]
        if c == 32 or c == 9 or c == 10 or c == 13:
            sc.i += 1
        else:
            return


cdef int _string(Scan *sc, bint *escaped) noexcept nogil:
    """A string at sc.i (its opening quote), strict: no control characters, valid escapes,
    well-formed UTF-8. 0, or -1."""
    cdef unsigned char c, c1
    cdef int k, extra
    escaped[0] = False
    sc.i += 1
    while sc.i < sc.n:
        c = sc.s[sc.i]
        if c == 34:  # "
            sc.i += 1
            return 0
        if c < 32:
            return -1
        if c == 92:  # backslash
            escaped[0] = True
            if sc.i + 1 >= sc.n:
                return -1
            c = sc.s[sc.i + 1]
            if c == 117:  # \uXXXX
                if sc.i + 6 > sc.n:
                    return -1
                for k in range(2, 6):
                    c1 = sc.s[sc.i + k]
                    if not ((48 <= c1 <= 57) or (65 <= c1 <= 70) or (97 <= c1 <= 102)):
                        return -1
                sc.i += 6
            elif c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 or c == 116:
                sc.i += 2
            else:
                return -1
            continue
        if c < 0x80:
            sc.i += 1
            continue
        # UTF-8 (Unicode's table of well-formed sequences): no overlongs, no surrogates.
        if 0xC2 <= c <= 0xDF:
            extra = 1
        elif 0xE0 <= c <= 0xEF:
            extra = 2
        elif 0xF0 <= c <= 0xF4:
            extra = 3
        else:
            return -1
        if sc.i + extra >= sc.n:
            return -1
        c1 = sc.s[sc.i + 1]
        if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F) or (c == 0xF0 and c1 < 0x90) or \
                (c == 0xF4 and c1 > 0x8F):
            return -1
        for k in range(1, extra + 1):
            if sc.s[sc.i + k] & 0xC0 != 0x80:
                return -1
        sc.i += extra + 1
    return -1


cdef inline Py_ssize_t _digits(Scan *sc) noexcept nogil:
    """How many digits sc.i moved over."""
    cdef Py_ssize_t start = sc.i
    while sc.i < sc.n and 48 <= sc.s[sc.i] <= 57:
        sc.i += 1
    return sc.i - start


cdef int _number(Scan *sc, bint *integer) noexcept nogil:
    """-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?; integer: neither fraction nor exponent."""
    integer[0] = True
    if sc.i < sc.n and sc.s[sc.i] == 45:
        sc.i += 1
    if sc.i >= sc.n:
        return -1
    if sc.s[sc.i] == 48:
        sc.i += 1
    elif not (49 <= sc.s[sc.i] <= 57):
        return -1
    else:
        _digits(sc)
    if sc.i < sc.n and sc.s[sc.i] == 46:
        integer[0] = False
        sc.i += 1
        if _digits(sc) == 0:
            return -1
    if sc.i < sc.n and (sc.s[sc.i] == 101 or sc.s[sc.i] == 69):
        integer[0] = False
        sc.i += 1
        if sc.i < sc.n and (sc.s[sc.i] == 43 or sc.s[sc.i] == 45):
            sc.i += 1
        if _digits(sc) == 0:
            return -1
    return 0


cdef int _literal(Scan *sc, const char *word, Py_ssize_t length) noexcept nogil:
    cdef Py_ssize_t k
    if sc.i + length > sc.n:
        return -1
    for k in range(length):
        if sc.s[sc.i + k] != <unsigned char>word[k]:
            return -1
    sc.i += length
    return 0


cdef inline bint _opened_empty(Scan *sc, unsigned char close) noexcept nogil:
    """Past an opening bracket and the space after it; True if `close` follows (consumed)."""
    sc.i += 1
    _ws(sc)
    if sc.i < sc.n and sc.s[sc.i] == close:
        sc.i += 1
        return True
    return False


cdef inline int _after_item(Scan *sc, unsigned char close) noexcept nogil:
    """After an object member or an array element: 0 at `close` (consumed), 1 after a comma
    (consumed, and the space after it), -1 at anything else."""
    _ws(sc)
    if sc.i >= sc.n:
        return -1
    cdef unsigned char c = sc.s[sc.i]
    sc.i += 1
    if c == close:
        return 0
    if c != 44:
        return -1
    _ws(sc)
    return 1


cdef int _json_value(Scan *sc, int depth, const char **names, Py_ssize_t *lengths, int level, int levels) noexcept nogil:
    """The value at sc.i. `level` < `levels`: an object on the path, whose member names[level]
    is looked for (the last one counts, as json reads duplicates); else any value. 0, or -1."""
    cdef unsigned char c
    cdef Py_ssize_t name_start, name_end, value_start
    cdef bint escaped, integer, match
    cdef int more
    if depth > MAX_DEPTH or sc.i >= sc.n:
        return -1
    c = sc.s[sc.i]
    if c == 123:  # {
        if _opened_empty(sc, 125):
            return 0
        while True:
            if sc.i >= sc.n or sc.s[sc.i] != 34:
                return -1
            name_start = sc.i + 1
            if _string(sc, &escaped) < 0:
                return -1
            name_end = sc.i - 1
            match = False
            if level < levels:
                if escaped:
                    return -1  # an escaped name might spell the one looked for: give up
                match = name_end - name_start == lengths[level] and \
                    memcmp(sc.s + name_start, names[level], lengths[level]) == 0
            _ws(sc)
            if sc.i >= sc.n or sc.s[sc.i] != 58:  # :
                return -1
            sc.i += 1
            _ws(sc)
            if match:
                sc.key_start = -1  # a later duplicate replaces an earlier one, found or not
                if level + 1 < levels:
                    if sc.i >= sc.n or sc.s[sc.i] != 123:
                        return -1  # not an object: no such field
                    if _json_value(sc, depth + 1, names, lengths, level + 1, levels) < 0:
                        return -1
                else:
                    value_start = sc.i
                    if sc.i < sc.n and sc.s[sc.i] == 34:
                        if _string(sc, &escaped) < 0 or escaped or sc.i - value_start <= 2:
                            return -1  # escapes, or empty: read by core/keys.py
                        sc.key_start, sc.key_end = value_start + 1, sc.i - 1
                    elif sc.i < sc.n and (sc.s[sc.i] == 45 or 48 <= sc.s[sc.i] <= 57):
                        if _number(sc, &integer) < 0 or not integer:
                            return -1
                        if sc.i - value_start == 2 and sc.s[value_start] == 45 and sc.s[value_start + 1] == 48:
                            return -1  # -0 is the integer 0
                        sc.key_start, sc.key_end = value_start, sc.i
                    else:
                        return -1
            elif _json_value(sc, depth + 1, names, lengths, levels, levels) < 0:
                return -1
            more = _after_item(sc, 125)
            if more <= 0:
                return more
    if level < levels:
        return -1  # the value on the path is not an object
    if c == 91:  # [
        if _opened_empty(sc, 93):
            return 0
        while True:
            if _json_value(sc, depth + 1, names, lengths, levels, levels) < 0:
                return -1
            more = _after_item(sc, 93)
            if more <= 0:
                return more
    if c == 34:
        return _string(sc, &escaped)
    if c == 45 or 48 <= c <= 57:
        return _number(sc, &integer)
    if c == 116:
        return _literal(sc, "true", 4)
    if c == 102:
        return _literal(sc, "false", 5)
    if c == 110:
        return _literal(sc, "null", 4)
    return -1


cdef int key_path(tuple path, list keep, KeyPath *kp) except -1:
    """The key's path for json_key, its names' bytes kept alive in `keep`; 1: a path it does not
    take (give up)."""
    cdef int k
    kp.levels = len(path)
    if kp.levels < 1 or kp.levels > 8:
        return 1
    for k in range(kp.levels):
        keep.append(path[k].encode())
        kp.names[k] = PyBytes_AS_STRING(keep[k])
        kp.lengths[k] = PyBytes_GET_SIZE(keep[k])
    return 0


cdef object json_key(const unsigned char *s, Py_ssize_t n, KeyPath *kp):
    """The key of one JSON value (bytes), or None where the scan gives up."""
    cdef Scan sc
    sc.s, sc.n, sc.i, sc.key_start = s, n, 0, -1
    _ws(&sc)
    if _json_value(&sc, 0, kp.names, kp.lengths, 0, kp.levels) < 0 or sc.key_start < 0:
        return None
    _ws(&sc)
    if sc.i != sc.n:
        return None
    return PyBytes_FromStringAndSize(<const char *>sc.s + sc.key_start, sc.key_end - sc.key_start)


def json_keys(list values, tuple path):
    """The dedup keys of a batch of JSON values (the field at `path`, a tuple of names), or
    None when any value is not the common case: then core/keys.py decides for the batch."""
    cdef KeyPath kp
    cdef list keep = []
    if key_path(path, keep, &kp) != 0:
        return None
    cdef Py_ssize_t i, n = PyList_GET_SIZE(values)
    cdef list out = [None] * n
    cdef object v, k
    for i in range(n):
        v = <object>PyList_GET_ITEM(values, i)
        if type(v) is not bytes:
            return None
        k = json_key(<const unsigned char *>PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), &kp)
        if k is None:
            return None
        out[i] = k
    return out


# -- store calls, a key at a time ---------------------------------------------------------------

def split_found(get, list keys):
    """([k for k in keys if get(k) is not None], the others): one call of a store's get per
    key, without a Python frame around each."""
    cdef list hit = [], miss = []
    cdef Py_ssize_t i, n = PyList_GET_SIZE(keys)
    cdef object k
    for i in range(n):
        k = <object>PyList_GET_ITEM(keys, i)
        if get(k) is not None:
            hit.append(k)
        else:
            miss.append(k)
    return hit, miss


cdef struct Entry:
    const char *data
    Py_ssize_t size
    PyObject *obj


cdef int _bytewise(const void *a, const void *b) noexcept nogil:
    cdef const Entry *x = <const Entry *>a
    cdef const Entry *y = <const Entry *>b
    cdef int c = memcmp(x.data, y.data, x.size if x.size < y.size else y.size)
    if c != 0:
        return c
    return (x.size > y.size) - (x.size < y.size)


def put_sorted(put, list keys, value, handle):
    """put(k, value, handle) for each key in bytewise order (as sorted() orders bytes, and
    RocksDB's comparator): the memtable then inserts each key next to the one before."""
    cdef Py_ssize_t i, n = PyList_GET_SIZE(keys)
    cdef Entry *entries = <Entry *>malloc(n * sizeof(Entry) + 1)
    cdef object k
    if entries == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            k = <object>PyList_GET_ITEM(keys, i)
            if type(k) is not bytes:
                raise TypeError(f"a key is {type(k).__name__}, not bytes")
            entries[i].data = PyBytes_AS_STRING(k)
            entries[i].size = PyBytes_GET_SIZE(k)
            entries[i].obj = <PyObject *>k
        qsort(entries, n, sizeof(Entry), _bytewise)
        for i in range(n):
            put(<object>entries[i].obj, value, handle)
    finally:
        free(entries)
