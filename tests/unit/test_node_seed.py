"""localenv/node/seed.py: a new node's containerd root planted from the bundle's seed, hard links
but for the databases containerd writes in place (the seed itself is made by a real containerd:
every node-tier start runs it)."""

from pathlib import Path

from localenv.node.seed import plant, seed_dir


def _seed(root: Path) -> Path:
    for rel, data in {"io.containerd.content.v1.content/blobs/sha256/ab": b"layer",
                      "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/bin/sh": b"elf",
                      "io.containerd.snapshotter.v1.overlayfs/metadata.db": b"snapshots",
                      "io.containerd.metadata.v1.bolt/meta.db": b"images"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_seed_dir_is_named_by_the_bundle():
    assert seed_dir(Path("/c/bundle-e5417eb67b44bba5.tar")) == Path("/c/containerd-e5417eb67b44bba5")


def test_a_new_root_links_the_seed_and_copies_its_databases(tmp_path):
    seed = _seed(tmp_path / "seed")
    root = tmp_path / "node" / "containerd"
    root.parent.mkdir()
    assert plant(seed, root)
    for rel in ("io.containerd.content.v1.content/blobs/sha256/ab",
                "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/bin/sh"):
        assert (root / rel).stat().st_ino == (seed / rel).stat().st_ino, rel
    for rel in ("io.containerd.snapshotter.v1.overlayfs/metadata.db", "io.containerd.metadata.v1.bolt/meta.db"):
        assert (root / rel).stat().st_ino != (seed / rel).stat().st_ino, rel
        (root / rel).write_bytes(b"changed by the node")
        assert (seed / rel).read_bytes() != b"changed by the node", rel
    assert not (tmp_path / "node" / "containerd.seeding").exists()


def test_an_existing_root_or_a_missing_seed_plants_nothing(tmp_path):
    root = tmp_path / "containerd"
    root.mkdir()
    (root / "kept").write_text("a node that comes back keeps its disk")
    assert not plant(_seed(tmp_path / "seed"), root)
    assert [p.name for p in root.iterdir()] == ["kept"]
    assert not plant(tmp_path / "no-seed", tmp_path / "other")
    assert not (tmp_path / "other").exists()
