"""Dedup snapshots, pure (eopipe.dedup.snapshot): whether a lost store is restored from a
snapshot or rebuilt, the manifest as the object store returns it (bad ones rejected), the
backup URI, retention; and the checkpoint's meta read without changing it (a real RocksDB)."""

from __future__ import annotations

import json
import pytest

from eopipe.dedup import snapshot
from eopipe.dedup.snapshot import Choice, Facts, FileRef, Location, Manifest, StoredFile

NOW = 100_000_000
WINDOW = 3_600_000
SEGMENT = 900_000
SHA = "ab" * 32


def manifest(**kw) -> Manifest:
    base = dict(partition=1, source_topic="src", group="ns.pipe", created_ms=NOW - 60_000, applied_offset=800,
                partition_count=4,
                watermark_ms=NOW - 60_000, covered_since_ms=NOW - WINDOW, window_ms=WINDOW,
                files=(FileRef("CURRENT", SHA, 16), FileRef("000009.sst", "cd" * 32, 4096)))
    return Manifest(**{**base, **kw})


def facts(**kw) -> Facts:
    """Partition 1 of 4, its store gone, committed at 1000, a snapshot at 800."""
    base = dict(store_present=False, committed=1000, log_start=0, source_topic="src", group="ns.pipe", home_count=4,
                reshard=False,
                now_ms=NOW, window_ms=WINDOW, segment_ms=SEGMENT, snapshot=manifest())
    return Facts(**{**base, **kw})


DECISIONS = [
    pytest.param({}, Choice.RESTORE, "replay from 800 to 1000", id="lost store, usable snapshot: restore"),
    pytest.param(dict(snapshot=manifest(applied_offset=1000)), Choice.RESTORE, "replay from 1000 to 1000",
                 id="snapshot at the committed offset: nothing to replay"),
    pytest.param(dict(store_present=True), Choice.KEEP, "present", id="store present: the usual recovery"),
    pytest.param(dict(committed=-1), Choice.KEEP, "nothing committed", id="never committed: starts empty"),
    pytest.param(dict(snapshot=None), Choice.REBUILD, "no snapshot", id="no snapshot: rebuild"),
    pytest.param(dict(snapshot=manifest(applied_offset=1200)), Choice.REBUILD, "ahead",
                 id="snapshot ahead of the committed offset (another life of the group): rebuild"),
    pytest.param(dict(log_start=801), Choice.REBUILD, "retention",
                 id="retention deleted records after the snapshot: rebuild"),
    pytest.param(dict(log_start=800), Choice.RESTORE, "replay from 800",
                 id="log start at the snapshot's offset: every record to replay is there"),
    pytest.param(dict(home_count=8), Choice.REBUILD, "complete for 4 partitions, not 8",
                 id="partition count changed since: stale, rebuild"),
    pytest.param(dict(snapshot=manifest(partition_count=None)), Choice.REBUILD, "complete for None",
                 id="snapshot not marked complete for any count: rebuild"),
    pytest.param(dict(reshard=True), Choice.REBUILD, "not 4", id="a re-shard in progress: rebuild"),
    pytest.param(dict(source_topic="other"), Choice.REBUILD, "topic 'src'", id="snapshot of another topic"),
    pytest.param(dict(group="ns.other"), Choice.REBUILD, "group 'ns.pipe'",
                 id="another pipeline's snapshot under the same URI: never used"),
    pytest.param(dict(snapshot=manifest(watermark_ms=NOW - WINDOW - SEGMENT - 1)), Choice.REBUILD,
                 "older than the window", id="every key of the snapshot expired: rebuild reads less"),
    pytest.param(dict(snapshot=manifest(watermark_ms=None)), Choice.RESTORE, "replay",
                 id="a snapshot of a store that never saw an event time"),
]


@pytest.mark.parametrize("kw, choice, reason", DECISIONS)
def test_choose(kw, choice, reason):
    d = snapshot.choose(facts(**kw))
    assert d.choice is choice and reason in d.reason, d


def doc(**kw) -> dict:
    d = json.loads(manifest().to_json())
    d.update(kw)
    return d


def test_manifest_round_trip():
    m = manifest()
    assert snapshot.parse_manifest(m.to_json(), 1) == m
    assert m.bytes == 16 + 4096


def _file(**kw) -> dict:
    return {"name": "000009.sst", "sha256": SHA, "size": 1, **kw}


BAD = [
    pytest.param(b"\x00not json", "not JSON", id="not JSON"),
    pytest.param(b"[]", "keys", id="not an object"),
    pytest.param(b" " * (snapshot.MAX_MANIFEST_BYTES + 1), "larger", id="too large"),
    pytest.param(doc(extra=1), "keys", id="an unknown key"),
    pytest.param({k: v for k, v in doc().items() if k != "window_ms"}, "keys", id="a missing key"),
    pytest.param(doc(version=2), "version", id="another version"),
    pytest.param(doc(partition=2), "partition 2", id="another partition's"),
    pytest.param(doc(applied_offset=-1), "applied_offset", id="negative offset"),
    pytest.param(doc(applied_offset="800"), "applied_offset", id="offset as a string"),
    pytest.param(doc(applied_offset=True), "applied_offset", id="offset as a bool"),
    pytest.param(doc(partition_count=0), "partition_count", id="zero partitions"),
    pytest.param(doc(source_topic=""), "source_topic", id="empty topic"),
    pytest.param(doc(group=7), "group", id="group not a string"),
    pytest.param(doc(files=[]), "files", id="no files"),
    pytest.param(doc(files=[_file(name="CURRENT")] * 2), "repeat", id="a name twice"),
    pytest.param(doc(files=[_file()]), "CURRENT", id="no CURRENT"),
    pytest.param(doc(files=[_file(name="CURRENT"), _file(name="../x")]), "plain file name", id="a path"),
    pytest.param(doc(files=[_file(name="CURRENT"), _file(name="a/b")]), "plain file name", id="a slash"),
    pytest.param(doc(files=[_file(name="CURRENT", sha256="AB" * 32)]), "sha256", id="uppercase digest"),
    pytest.param(doc(files=[_file(name="CURRENT", sha256="ab")]), "sha256", id="short digest"),
    pytest.param(doc(files=[_file(name="CURRENT", size=-1)]), "size", id="negative size"),
    pytest.param(doc(files=[_file(name="CURRENT", size=snapshot.MAX_FILE_BYTES + 1)]), "size", id="huge size"),
    pytest.param(doc(files=[_file(name="CURRENT", extra=1)]), "keys", id="a file's unknown key"),
]


@pytest.mark.parametrize("data, msg", BAD)
def test_bad_manifests_are_rejected(data, msg):
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    with pytest.raises(snapshot.BadManifest, match=msg):
        snapshot.parse_manifest(raw, 1)


@pytest.mark.parametrize("uri, loc", [
    ("s3://bucket", Location("bucket", "")),
    ("s3://bucket/", Location("bucket", "")),
    ("s3://my.bucket/a/b/", Location("my.bucket", "a/b")),
])
def test_uri(uri, loc):
    assert snapshot.parse_uri(uri) == loc


@pytest.mark.parametrize("uri", ["bucket/x", "s3a://bucket/x", "s3://B/x", "s3://b", "s3://bucket/a//b",
                                 "s3://bucket/a/../b", "https://bucket/x"])
def test_bad_uri(uri):
    with pytest.raises(ValueError, match="bad backup URI"):
        snapshot.parse_uri(uri)


def test_keys():
    loc = Location("b", "pre")
    assert loc.manifest_key(3, 42) == "pre/p-3/m-0000000000000042.json"
    assert loc.file_key(3, SHA) == f"pre/p-3/f/{SHA}"
    assert Location("b", "").manifest_key(0, 1) == "p-0/m-0000000000000001.json"
    assert snapshot.manifest_created("pre/p-3/m-0000000000000042.json") == 42
    for not_one in ("pre/p-3/m-42.json", "pre/p-3/f/m-0000000000000042.json.tmp", "m-000000000000004x.json"):
        assert snapshot.manifest_created(not_one) is None


def test_retention_keeps_the_newest():
    keys = [Location("b", "").manifest_key(0, t) for t in (30, 10, 20, 40)]
    kept, old = snapshot.retention(keys + ["p-0/junk"], 2)
    assert kept == [keys[0], keys[3]] and old == [keys[1], keys[2]]
    assert snapshot.retention(keys, 10) == (sorted(keys), [])


def test_orphans_spare_named_and_young_files():
    files = [StoredFile("named", 9999), StoredFile("old", 9999), StoredFile("young", 5)]
    assert snapshot.orphans(files, {"named"}, grace_s=600) == ["old"]


def test_checkpoint_meta_is_read_without_changing_it(tmp_path):
    from eopipe.dedup.partition_store import read_meta
    from eopipe.dedup.store import StateStore

    s = StateStore(tmp_path / "state", window_ms=WINDOW, segment_ms=SEGMENT, memory_bytes=16 << 20)
    ps = s.open(0)
    ps.apply({b"k1": NOW, b"k2": NOW - SEGMENT}, 17, partition_count=3, now_ms=NOW)
    ps.note(covered_since_ms=NOW - WINDOW, window_ms=WINDOW)
    ck = ps.checkpoint(tmp_path / "ck")
    before = sorted((f.name, f.stat().st_size) for f in ck.iterdir())
    meta = read_meta(ck)
    assert meta == {"applied_offset": 17, "partition_count": 3, "watermark_ms": NOW,
                    "covered_since_ms": NOW - WINDOW, "window_ms": WINDOW}
    assert sorted((f.name, f.stat().st_size) for f in ck.iterdir()) == before
    # A later write to the live store is not in the checkpoint.
    ps.apply({b"k3": NOW}, 18, now_ms=NOW)
    assert read_meta(ck)["applied_offset"] == 17
    s.close()



def test_a_long_transfer_logs_its_progress_at_most_every_interval(caplog):
    from eopipe.dedup.backup import PROGRESS_SECONDS, Progress

    now = [0.0]
    p = Progress("restoring snapshot", 3, total_bytes=400, total_files=4, clock=lambda: now[0])
    logged = []
    for step, size in ((1.0, 100), (PROGRESS_SECONDS, 100), (1.0, 100), (PROGRESS_SECONDS, 100)):
        now[0] += step
        with caplog.at_level("INFO", logger="eopipe.dedup"):
            logged.append(p.add(size))
    # The second file is past the interval; the third within it; the last is the caller's line.
    assert logged == [False, True, False, False]
    line = [r for r in caplog.records if r.getMessage().startswith("restoring snapshot")]
    assert len(line) == 1 and (p.bytes, p.files) == (400, 4)
