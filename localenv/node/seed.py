"""A containerd root with the tier's image bundle imported, made once per bundle and cached
beside it; a new node's root starts as hard links to it, as a kind node image carries its
images preloaded. Each node importing the 1.7 GB bundle itself (its layers, then their
unpacked snapshots) was most of the tier's start: 75 s for three nodes.

The node's containerd then holds what its own import would have made: the same metadata, the
same content and snapshots. What containerd changes in place, its bolt databases, each node
gets a copy of; the rest it only adds and removes (overlayfs never writes a lower layer)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from localenv.node import CNI_BIN_DIR
from localenv.node import config as cfg
from localenv.node.images import import_images


def seed_dir(bundle: Path) -> Path:
    return bundle.with_name(bundle.name.replace("bundle-", "containerd-", 1).removesuffix(".tar"))


def ensure_seed(bundle: Path, pause_image: str) -> Path:
    """The bundle's seed root, made by a containerd of its own (no network, no CRI pod) if
    missing; seeds of other bundles removed."""
    dest = seed_dir(bundle)
    if dest.exists():
        return dest
    from localenv.node.kubelet import Processes  # here: kubelet imports this module

    with tempfile.TemporaryDirectory(dir=bundle.parent, prefix="seed-") as tmp:
        work = Path(tmp)
        sock = work / "run" / "containerd.sock"
        toml = work / "containerd.toml"
        toml.write_text(cfg.containerd_toml(work, work / "run", sock, CNI_BIN_DIR, work / "cni", pause_image))
        ctr = ["ctr", "--address", str(sock)]
        procs = Processes(bundle.parent / "seed-logs")  # kept: a failed start names this log
        procs.spawn("containerd", ["containerd", "--config", str(toml)])
        try:
            procs.wait("the image seed's containerd",
                       lambda: subprocess.run([*ctr, "version"], capture_output=True).returncode == 0, 60)
            import_images(ctr, [bundle])
        finally:
            procs.stop_all()
        for old in bundle.parent.glob("containerd-*"):
            shutil.rmtree(old, ignore_errors=True)
        (work / "containerd").rename(dest)
    return dest


def plant(seed: Path, root: Path) -> bool:
    """A new node's containerd root made from `seed`: hard links, its databases copied. False
    (nothing made) where the root exists already (a node that comes back keeps its disk), the
    seed is missing or the two are on different file systems: the node imports the bundle."""
    if root.exists() or not seed.is_dir():
        return False
    part = root.with_name(root.name + ".seeding")
    shutil.rmtree(part, ignore_errors=True)
    if subprocess.run(["cp", "-al", str(seed), str(part)], capture_output=True).returncode != 0:
        shutil.rmtree(part, ignore_errors=True)
        return False
    for db in part.rglob("*.db"):
        db.unlink()
        shutil.copy2(seed / db.relative_to(part), db)
    part.rename(root)
    return True
