"""The compiled per-record steps of the dedup loop (core/native.pyx), table-tested on real
confluent-kafka Message objects; the produce they call is a recorder (what dedup/batch.py
does with a hand-back is its own test's business)."""

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException, Message

from eopipe.core import native
from eopipe.core.headers import H_REROUTED


def msg(offset, key=b"k", value=b"v", headers=None, ts=(TIMESTAMP_CREATE_TIME, 1000), error=None):
    return Message(topic="src", partition=0, offset=offset, key=key, value=value, headers=headers, timestamp=ts,
                   error=error)


EOF_ERR = KafkaError(KafkaError._PARTITION_EOF)


@pytest.mark.parametrize("by_key, kinds, good, keys, odd, last", [
    (True, [], [], [], [], None),
    (True, ["a", "b"], [0, 1], [b"a", b"b"], [], 1),
    (True, ["a", None, "", "b"], [0, 3], [b"a", b"b"], [1, 2], 3),
    (True, ["a", "err"], [0], [b"a"], [1], 0),
    (True, ["err", "err"], [], [], [0, 1], None),
    (True, [None], [], [], [0], 0),                 # no key, but no error: the last record read
    (False, ["a", None, "err"], [0, 1], [], [2], 1),  # a JSON key: every record without an error
])
def test_split_keeps_order_and_hands_back_the_odd_ones(by_key, kinds, good, keys, odd, last):
    msgs = [msg(i, error=EOF_ERR) if k == "err" else msg(i, key=None if k is None else k.encode())
            for i, k in enumerate(kinds)]
    g, ks, o, lst = native.split(msgs, by_key)
    assert [m.offset() for m in g] == good and ks == keys and [m.offset() for m in o] == odd
    assert (lst.offset() if lst is not None else None) == last


class Recorder:
    def __init__(self, fail_at=()):
        self.calls, self.fail_at = [], dict(fail_at)

    def __call__(self, *args):
        err = self.fail_at.pop(args[1], None)
        if err is not None:
            raise err
        self.calls.append(args)


@pytest.mark.parametrize("pending, seen, broken, start, want_sent, want_dups", [
    ({}, set(), False, 0, [b"a", b"b", b"c"], 0),
    ({b"a": 5}, set(), False, 0, [b"b", b"c"], 1),
    ({}, {b"b"}, False, 0, [b"a", b"c"], 1),
    ({b"a": 5}, {b"b", b"c"}, False, 0, [], 3),
    ({b"a": 5}, {b"b"}, True, 0, [b"a", b"b", b"c"], 0),  # the no-dedup fault: all count as new
    ({}, set(), False, 2, [b"c"], 0),                   # on from a record handed back
])
def test_emit_drops_what_is_pending_or_seen_and_sends_the_rest(pending, seen, broken, start, want_sent, want_dups):
    good = [msg(0, key=b"a", value=b"va"), msg(1, key=b"b", value=b"vb"), msg(2, key=b"c", value=b"vc")]
    keys = [b"a", b"b", b"c"]
    rec = Recorder()
    before = dict(pending)
    assert native.emit(good, keys, start, pending, seen, broken, rec, "out", 3, H_REROUTED) == \
        (3, len(want_sent), want_dups)
    assert [c[2] for c in rec.calls] == want_sent
    assert all(c[0] == "out" and c[3] == 3 and c[4] is None and c[5] is None for c in rec.calls)
    assert pending == {**before, **dict.fromkeys(want_sent, 1000)}


def test_emit_keeps_timestamps_and_headers_but_not_the_reroute_mark():
    good = [msg(0, key=b"a", headers=[("h", b"1"), (H_REROUTED, b"2:7")]),
            msg(1, key=b"b", headers=[(H_REROUTED, b"0:1")]),
            msg(2, key=b"c", ts=(TIMESTAMP_NOT_AVAILABLE, -1))]
    pending, rec = {}, Recorder()
    native.emit(good, [b"ka", b"kb", b"kc"], 0, pending, set(), False, rec, "out", 0, H_REROUTED)
    # (topic, value, record key, partition, callback, on_delivery, timestamp, headers): the
    # record's own key goes out, whatever the dedup key.
    assert [(c[1], c[2], c[6], c[7]) for c in rec.calls] == [
        (b"v", b"a", 1000, [("h", b"1")]), (b"v", b"b", 1000, None), (b"v", b"c", 0, None)]
    assert pending == {b"ka": 1000, b"kb": 1000, b"kc": 0}


@pytest.mark.parametrize("error", [BufferError("queue full"),
                                   KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))])
def test_emit_hands_back_the_record_whose_produce_raised(error):
    good = [msg(0, key=b"a", value=b"va"), msg(1, key=b"b", value=b"vb"), msg(2, key=b"c", value=b"vc")]
    keys = [b"a", b"b", b"c"]
    pending, rec = {}, Recorder({b"vb": error})
    assert native.emit(good, keys, 0, pending, set(), False, rec, "out", 0, H_REROUTED) == (1, 1, 0)
    assert pending == {b"a": 1000, b"b": 1000}  # the caller sends b with its timestamp from here
    assert native.emit(good, keys, 2, pending, set(), False, rec, "out", 0, H_REROUTED) == (3, 1, 0)
    assert [c[1] for c in rec.calls] == [b"va", b"vc"]


def test_emit_lets_other_errors_through():
    rec = Recorder({b"v": ValueError("a bug")})
    with pytest.raises(ValueError, match="a bug"):
        native.emit([msg(0)], [b"k"], 0, {}, set(), False, rec, "out", 0, H_REROUTED)


def test_split_found_asks_the_store_once_per_key():
    store, asked = {b"a": b"", b"c": b"x"}, []

    def get(k):
        asked.append(k)
        return store.get(k)
    assert native.split_found(get, [b"a", b"b", b"c", b"d"]) == ([b"a", b"c"], [b"b", b"d"])
    assert asked == [b"a", b"b", b"c", b"d"] and native.split_found(get, []) == ([], [])


def test_put_sorted_puts_in_bytewise_order():
    import random

    rng = random.Random(4)
    keys = [rng.randbytes(rng.randrange(0, 6)) for _ in range(2000)] + [b"ab", b"a", b"ab\x00", b"\xff", b""]
    puts = []
    native.put_sorted(lambda k, v, h: puts.append((k, v, h)), keys, b"", "cf")
    assert puts == [(k, b"", "cf") for k in sorted(keys)]
    with pytest.raises(TypeError, match="a key is str, not bytes"):
        native.put_sorted(lambda *a: None, [b"a", "b"], b"", None)


def test_murmur2_takes_bytes_only():
    """A key that is not bytes is an error, not a read of whatever the pointer holds."""
    with pytest.raises(TypeError):
        native.murmur2_partitions([b"a", "b"], 4)
    with pytest.raises(TypeError):
        native.murmur2_partition("b", 4)
