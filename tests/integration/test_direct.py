"""dedup/direct.pyx on the real broker: its records read straight from a partition's fetch queue
read as confluent-kafka's Messages of the same records do, and what it produces in a transaction
is what a read_committed consumer reads, headers, timestamps and partitions included."""

import threading

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, KafkaError, Producer, TopicPartition

from eopipe.core import native
from eopipe.core.headers import H_REROUTED
from eopipe.dedup import clients, direct

pytestmark = pytest.mark.kafka

# (key, value, headers): a plain one, one without a key, a tombstone, one with the reroute mark
# and another header, one with only the reroute mark, and the plain one again.
RECORDS = [(b"a", b"va", None), (None, b"no key", None), (b"t", None, None),
           (b"b", b"vb", [(H_REROUTED, b"2:7"), ("trace", b"x")]), (b"c", b"vc", [(H_REROUTED, b"1:3")]),
           (b"a", b"va again", None)]


def _fill(pipe) -> None:
    p = Producer({"bootstrap.servers": pipe.bootstrap})
    for i, (k, v, h) in enumerate(RECORDS):
        p.produce(pipe.source, v, k, 0, timestamp=1_700_000_000_000 + i, headers=h)
    assert p.flush(30) == 0


def _consumer(pipe, client_id: str, **kw) -> Consumer:
    return Consumer({"bootstrap.servers": pipe.bootstrap, "group.id": pipe.group, "client.id": client_id,
                     "enable.auto.commit": False, "isolation.level": "read_committed",
                     "enable.partition.eof": True, **kw})


def _read_all(reader, n: int) -> "direct.Batch":
    b = reader.read(n, 30)
    assert b is not None and len(b) == n, "the reader did not get the records"
    return b


def test_the_direct_path_runs_here():
    assert direct.unavailable() is None


def test_clients_that_are_not_the_named_kind_get_no_direct_path(pipe):
    c = _consumer(pipe, "me.consumer")
    p = Producer({"bootstrap.servers": pipe.bootstrap, "client.id": "me.producer"})
    try:
        assert direct.reader(c, "someone-else.consumer", pipe.source, 0) is None
        assert direct.writer(c, "me.consumer") is None       # a consumer is no producer
        assert direct.reader(p, "me.producer", pipe.source, 0) is None
        assert direct.writer(p, "me.producer") is not None
        assert direct.writer(object(), "me.producer") is None
    finally:
        c.close()


def test_records_read_directly_read_as_messages_do_and_bypass_the_consumers_queue(pipe):
    _fill(pipe)
    plain = _consumer(pipe, "plain.consumer")
    plain.assign([TopicPartition(pipe.source, 0, 0)])
    msgs = [m for m in plain.consume(len(RECORDS) + 1, 30) if m.error() is None]
    plain.close()
    assert len(msgs) == len(RECORDS)

    c = _consumer(pipe, "me.consumer")
    c.assign([TopicPartition(pipe.source, 0, 0)])
    r = direct.reader(c, "me.consumer", pipe.source, 0)
    c.seek(TopicPartition(pipe.source, 0, 0))  # as the worker does: outdates what moved already
    b = _read_all(r, len(RECORDS))
    try:
        for i, m in enumerate(msgs):
            got = b.record(i)
            assert (got.key(), got.value(), got.headers(), got.timestamp(), got.offset(), got.partition(),
                    got.error()) == (m.key(), m.value(), m.headers(), m.timestamp(), m.offset(), m.partition(), None)
        good, keys, odd, end = b.split(True)
        assert good == [0, 2, 3, 4, 5] and keys == [b"a", b"t", b"b", b"c", b"a"] and end == len(RECORDS)
        assert [o.offset() for o in odd] == [1] and odd[0].key() is None
        good, keys, odd, end = b.split(False)
        assert good == list(range(len(RECORDS))) and keys == [] and odd == []
        assert b.values([1, 2]) == [b"no key", None]
        with pytest.raises(IndexError):
            b.record(len(RECORDS))
        # The consumer's own queue sees none of them; the reader next sees the end of the partition.
        assert [m for m in c.consume(10, 1) if m.error() is None] == []
        eof = r.read(1, 10)
        assert eof is not None and eof.record(0).error().code() == KafkaError._PARTITION_EOF
        eof.free()
        # An abort assigns the committed offset again: the reader reads from there.
        c.assign([TopicPartition(pipe.source, 0, 2)])
        again = _read_all(r, 4)
        assert [again.record(i).offset() for i in range(4)] == [2, 3, 4, 5]
        again.free()
    finally:
        b.free()
        r.close()
        c.close()


def test_emit_produces_the_unseen_records_in_the_transaction(pipe):
    _fill(pipe)
    c = _consumer(pipe, "me.consumer")
    c.assign([TopicPartition(pipe.source, 0, 0)])
    r = direct.reader(c, "me.consumer", pipe.source, 0)
    c.seek(TopicPartition(pipe.source, 0, 0))
    prod = Producer({"bootstrap.servers": pipe.bootstrap, "client.id": "me.producer",
                     "transactional.id": f"{pipe.name}-direct"})
    prod.init_transactions(30)
    w = direct.writer(prod, "me.producer")
    b = _read_all(r, len(RECORDS))
    try:
        good, keys, _, _ = b.split(True)
        pending, seen = {b"t": 1}, {b"c"}
        prod.begin_transaction()
        assert b.emit(good, keys, 0, pending, seen, False, w, pipe.output, 1, H_REROUTED) == (5, 2, 3)
        assert pending == {b"t": 1, b"a": 1_700_000_000_000, b"b": 1_700_000_000_003}
        assert prod.flush(30) == 0  # the output's partitions known: a produce to one it lacks fails at once
        # A produce that fails stops the loop at that record, its key already pending (the caller
        # sends it itself and sees the error).
        stop = b.emit(good, keys, 0, {}, set(), False, w, pipe.output, 99, H_REROUTED)
        assert stop == (0, 0, 0)
        prod.commit_transaction(30)
    finally:
        b.free()
        r.close()
        c.close()
    out = _consumer(pipe, "check.consumer")
    out.assign([TopicPartition(pipe.output, 1, 0)])
    got = [m for m in out.consume(10, 10) if m.error() is None]
    out.close()
    assert [(m.key(), m.value(), m.headers(), m.timestamp(), m.partition()) for m in got] == [
        (b"a", b"va", None, (TIMESTAMP_CREATE_TIME, 1_700_000_000_000), 1),
        (b"b", b"vb", [("trace", b"x")], (TIMESTAMP_CREATE_TIME, 1_700_000_000_003), 1)]


def test_json_keys_are_read_where_librdkafka_holds_the_records(pipe):
    values = [b'{"user": {"id": "u1"}, "n": 1}', b' {"user": {"id": 42}} ', b'{"user": {"id": "u1"}}']
    p = Producer({"bootstrap.servers": pipe.bootstrap})
    for v in values + [b"not json"]:
        p.produce(pipe.source, v, None, 0)
    assert p.flush(30) == 0
    c = _consumer(pipe, "me.consumer")
    c.assign([TopicPartition(pipe.source, 0, 0)])
    r = direct.reader(c, "me.consumer", pipe.source, 0)
    c.seek(TopicPartition(pipe.source, 0, 0))
    b = _read_all(r, 4)
    try:
        assert b.json_keys([0, 1, 2], ("user", "id")) == native.json_keys(values, ("user", "id")) == [b"u1", b"42", b"u1"]
        assert b.json_keys([0, 3], ("user", "id")) is None  # gives up on the batch: batch.py reads it one by one
        assert b.json_keys([0], ("n",)) == [b"1"]
    finally:
        b.free()
        r.close()
        c.close()


def test_after_a_replay_the_reader_starts_at_the_committed_offset(pipe):
    """The worker's sequence: recovery reads p through consume() and assigns the committed
    offset; then the reader, and a seek there (retried until the new assignment fetches: a seek
    at once was refused with _STATE in CI)."""
    _fill(pipe)
    c = _consumer(pipe, "me.consumer")
    c.assign([TopicPartition(pipe.source, 0, 0)])
    assert [m.offset() for m in c.consume(3, 30)] == [0, 1, 2]
    c.assign([TopicPartition(pipe.source, 0, 3)])
    r = direct.reader(c, "me.consumer", pipe.source, 0)
    clients.seek_when_fetching(c, TopicPartition(pipe.source, 0, 3), threading.Event())
    b = _read_all(r, 3)
    try:
        assert [b.record(i).offset() for i in range(3)] == [3, 4, 5]
        assert [m for m in c.consume(10, 1) if m.error() is None] == []
    finally:
        b.free()
        r.close()
        c.close()
