# What core/native.pyx shares with other compiled modules (dedup/direct.pyx: JSON keys of records
# still in librdkafka's buffers).

cdef struct KeyPath:
    int levels
    const char *names[8]
    Py_ssize_t lengths[8]

cdef int key_path(tuple path, list keep, KeyPath *kp) except -1
cdef object json_key(const unsigned char *s, Py_ssize_t n, KeyPath *kp)
