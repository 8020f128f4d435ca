"""`eopipe load` and `eopipe verify` against the real broker: verify catches loss and duplicates."""

import json
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from eopipe.core import partitioner
from eopipe.core.keys import KeySpec
from eopipe.tools.loadgen import run_load
from eopipe.tools.verify import TopicReader, verify

pytestmark = pytest.mark.kafka


def _topics(bootstrap, *partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [f"lv-{uuid.uuid4().hex[:8]}" for _ in partitions]
    futs = admin.create_topics([NewTopic(n, p, 1) for n, p in zip(names, partitions)])
    for f in futs.values():
        f.result(30)
    return names


def _copy(bootstrap, records, topic, *, abort_extra=()):
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"copy-{uuid.uuid4().hex}"})
    p.init_transactions(30)
    p.begin_transaction()
    for k, v in records:
        p.produce(topic, key=k, value=v)
    p.commit_transaction(30)
    if abort_extra:
        p.begin_transaction()
        for k, v in abort_extra:
            p.produce(topic, key=k, value=v)
        p.flush(30)
        p.abort_transaction(30)


def test_load_places_records_and_makes_duplicates(kafka_bootstrap):
    (src,) = _topics(kafka_bootstrap, 4)
    stats = run_load(kafka_bootstrap, src, 2000, dup_ratio=0.3, wrong_partition_ratio=0.1,
                     poison=7, seed=1)
    assert stats["records"] == 2007 and stats["poison"] == 7
    assert stats["unique"] + stats["duplicates"] == 2000
    seen, misplaced, poison = {}, 0, 0
    for m in TopicReader(kafka_bootstrap).read(src):
        if m.key() is None:
            poison += 1
            continue
        seen[m.key()] = seen.get(m.key(), 0) + 1
        misplaced += partitioner.murmur2_partition(m.key(), 4) != m.partition()
    assert poison == 7
    assert len(seen) == stats["unique"]
    assert sum(seen.values()) - len(seen) == stats["duplicates"]
    assert misplaced == stats["wrong_partition"] > 0
    assert json.loads(next(iter(TopicReader(kafka_bootstrap).read(src))).value() or b"{}") is not None


def test_load_waits_when_the_producer_queue_is_full(kafka_bootstrap):
    """A producer queue far smaller than the load: the generator waits for deliveries instead of
    failing with BufferError (seen when a slow broker fell behind a 1M-record preload)."""
    (src,) = _topics(kafka_bootstrap, 2)
    stats = run_load(kafka_bootstrap, src, 3000, dup_ratio=0.0, seed=3,
                     producer_config={"queue.buffering.max.messages": 50})
    assert stats["records"] == 3000
    assert sum(1 for _ in TopicReader(kafka_bootstrap).read(src)) == 3000


def test_a_load_the_broker_refuses_fails_instead_of_counting_it(kafka_bootstrap):
    """Records the broker does not take (here: larger than the topic allows) make the load fail,
    so no caller counts records the topic does not hold: failures are reported by delivery."""
    name = f"lv-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config={"max.message.bytes": "64"})])[name].result(30)
    with pytest.raises(RuntimeError, match="records not delivered"):
        run_load(kafka_bootstrap, name, 20, dup_ratio=0.0, seed=5, producer_config={"message.timeout.ms": 10000})


def test_a_stopped_load_ends_and_counts_what_it_sent(kafka_bootstrap):
    """`stop` ends a load early (the e2e tests' load lasts as long as their faults): its counts are
    what the topic holds."""
    (src,) = _topics(kafka_bootstrap, 2)
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    stats = run_load(kafka_bootstrap, src, 100_000, dup_ratio=0.2, rate=500, seed=4, stop=stop)
    assert 0 < stats["records"] < 100_000
    assert sum(1 for _ in TopicReader(kafka_bootstrap).read(src)) == stats["records"]


def test_verify_counts_lost_duplicated_and_aborted(kafka_bootstrap):
    src, ok_out, bad_out = _topics(kafka_bootstrap, 3, 2, 2)
    run_load(kafka_bootstrap, src, 500, dup_ratio=0.25, poison=3, seed=2)
    unique = {}
    for m in TopicReader(kafka_bootstrap).read(src):
        if m.key():
            unique.setdefault(m.key(), m.value())
    records = list(unique.items())

    # The copier keeps no partitions (its producer picks them): no order to check.
    _copy(kafka_bootstrap, records, ok_out, abort_extra=records[:10])
    rep = verify(kafka_bootstrap, src, ok_out, key_spec=KeySpec(), settle=1, order=False)
    assert rep.ok, rep.line()
    assert (rep.unique_in, rep.out, rep.lost, rep.duplicated) == (len(records), len(records), 0, 0)
    assert rep.malformed_in == 3 and rep.aborted_reads == 10

    # Drop two keys, duplicate three: verify must see exactly that.
    _copy(kafka_bootstrap, records[2:] + records[10:13], bad_out)
    rep = verify(kafka_bootstrap, src, bad_out, key_spec=KeySpec.parse("json:id"), settle=1, order=False)
    assert not rep.ok
    assert (rep.lost, rep.duplicated) == (2, 3)
    assert sorted(rep.examples["lost"]) == sorted(k.decode() for k, _ in records[:2])


def test_cli_exit_status_follows_the_verdict(kafka_bootstrap):
    src, out = _topics(kafka_bootstrap, 2, 2)
    eopipe = [sys.executable, "-m", "eopipe.tools.cli"]
    load = subprocess.run(eopipe + ["load", "--bootstrap", kafka_bootstrap, "--topic", src,
                                    "--count", "300", "--seed", "3", "--json", "--quiet"],
                          capture_output=True, text=True, check=True)
    assert json.loads(load.stdout)["records"] == 300
    # Nothing was copied to the output: everything is lost, exit status 1.
    res = subprocess.run(eopipe + ["verify", "--bootstrap", kafka_bootstrap, "--source", src,
                                   "--output", out, "--settle", "1", "--json"],
                         capture_output=True, text=True)
    assert res.returncode == 1, res.stderr
    rep = json.loads(res.stdout)
    assert rep["lost"] == rep["unique_in"] > 0 and rep["ok"] is False


def test_backlog_sees_records_not_markers(kafka_bootstrap):
    """A group is drained when only transaction markers follow its committed offset."""
    from confluent_kafka import Consumer, TopicPartition

    from eopipe.tools.verify import backlog

    (topic,) = _topics(kafka_bootstrap, 1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    _copy(kafka_bootstrap, [(b"k1", b"v1"), (b"k2", b"v2")], topic)  # offsets 0, 1 + marker at 2
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    assert backlog(kafka_bootstrap, group, topic) > 0  # k2 not consumed yet
    c.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    assert backlog(kafka_bootstrap, group, topic) == 0  # only the commit marker follows
    _copy(kafka_bootstrap, [], topic, abort_extra=[(b"k3", b"v3")])  # an aborted record
    assert backlog(kafka_bootstrap, group, topic) == 0
    c.close()


def test_a_pending_transactional_offset_is_not_read_as_committed(kafka_bootstrap):
    """Watchers read a group's offsets as they stand (kafkaconf.OFFSETS_NOW): an offset sent in a
    transaction that has not committed is never what they read, so the backlog still counts the
    records it covers; once the transaction's commit has landed, the group is drained."""
    from confluent_kafka import Consumer, TopicPartition

    from eopipe.core.kafkaconf import OFFSETS_NOW
    from eopipe.tools.verify import backlog

    (topic,) = _topics(kafka_bootstrap, 1)
    _copy(kafka_bootstrap, [(b"k1", b"v1"), (b"k2", b"v2")], topic)  # offsets 0, 1 + marker at 2
    group = f"g-{uuid.uuid4().hex[:6]}"
    member = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    watcher = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False,
                        **OFFSETS_NOW})
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"offsets-{uuid.uuid4().hex}"})
    p.init_transactions(30)
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 2)], member.consumer_group_metadata(), 30)
    try:
        assert watcher.committed([TopicPartition(topic, 0)], timeout=30)[0].offset < 0  # none committed yet
        assert backlog(kafka_bootstrap, group, topic) > 0
        p.commit_transaction(30)
        # The coordinator writes the offset's commit marker after commit_transaction returns: it
        # shows a moment later (a read_committed read would wait for it).
        deadline = time.monotonic() + 30
        while watcher.committed([TopicPartition(topic, 0)], timeout=30)[0].offset != 2:
            assert time.monotonic() < deadline, "the committed offset never showed"
            time.sleep(0.05)
        assert backlog(kafka_bootstrap, group, topic) == 0
    finally:
        watcher.close()
        member.close()


def test_an_open_transaction_makes_verify_incomplete(kafka_bootstrap):
    """A transaction that never resolves holds read_committed readers back: verify gives no verdict
    (exit status 3) within its timeout, and says which partition it could not read to the end."""
    src, out = _topics(kafka_bootstrap, 1, 1)
    _copy(kafka_bootstrap, [(b"k1", b"v1")], src)
    _copy(kafka_bootstrap, [(b"k1", b"v1")], out)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"open-{uuid.uuid4().hex}",
                  "transaction.timeout.ms": 120_000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(src, key=b"k2", value=b"v2")
    p.flush(30)
    try:
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "eopipe.tools.cli", "verify", "--bootstrap", kafka_bootstrap,
                              "--source", src, "--output", out, "--settle", "1", "--timeout", "8"],
                             capture_output=True, text=True, timeout=90)
        took = time.monotonic() - t0
    finally:
        p.abort_transaction(30)
    assert res.returncode == 3, (res.returncode, res.stdout, res.stderr)
    assert took < 30, took
    assert res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"eopipe verify: incomplete after 8s: {src} was not read to its end: partition 0 "), \
        res.stderr
    assert "open transaction" in res.stderr, res.stderr


def test_verify_sees_a_partition_out_of_its_source_order(kafka_bootstrap):
    """The dedup stage keeps each source partition's order: an output holding every key once but
    with two records of a partition swapped fails (exit status 1), unless --no-order."""
    src, in_order, swapped = _topics(kafka_bootstrap, 2, 2, 2)
    run_load(kafka_bootstrap, src, 200, dup_ratio=0.2, seed=4)
    firsts: dict[bytes, tuple[int, bytes]] = {}
    for m in TopicReader(kafka_bootstrap).read(src):
        firsts.setdefault(m.key(), (m.partition(), m.value()))
    records = [(p, k, v) for k, (p, v) in firsts.items()]  # source order within each partition
    zero = [i for i, (p, _, _) in enumerate(records) if p == 0]
    bad = list(records)
    bad[zero[3]], bad[zero[4]] = bad[zero[4]], bad[zero[3]]
    for topic, recs in ((in_order, records), (swapped, bad)):
        pr = Producer({"bootstrap.servers": kafka_bootstrap})
        for p, k, v in recs:
            pr.produce(topic, key=k, value=v, partition=p)
        pr.flush(30)

    rep = verify(kafka_bootstrap, src, in_order, key_spec=KeySpec(), settle=1)
    assert rep.ok and rep.out_of_order == 0, rep.line()
    rep = verify(kafka_bootstrap, src, swapped, key_spec=KeySpec(), settle=1)
    assert (rep.lost, rep.duplicated, rep.out_of_order, rep.ok) == (0, 0, 1, False), rep.line()
    assert rep.examples["out_of_order"] == [records[zero[3]][1].decode()]

    eopipe = [sys.executable, "-m", "eopipe.tools.cli", "verify", "--bootstrap", kafka_bootstrap,
              "--source", src, "--output", swapped, "--settle", "1"]
    assert subprocess.run(eopipe, capture_output=True).returncode == 1
    assert subprocess.run(eopipe + ["--no-order"], capture_output=True).returncode == 0
