"""Docker-archives merged into one, each layer once, as `docker save IMAGE...` writes several
images: a node's containerd reads a layer once however many images share it. Separately, the
Spark Operator's image (the Spark image's layers plus one) makes every node stream the 1.1 GB of
Spark twice, and the images on the base stream the base again: 3.1 GB against 1.7 GB, imported
once into the nodes' seed (localenv/node/seed.py; `make cluster` prints its timings)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

MANIFEST, REPOSITORIES = "manifest.json", "repositories"


def bundle(archives: list[Path], cache: Path) -> Path:
    """One docker-archive of `archives` in `cache`, keyed by their names (each names its image's
    content hash); the previous bundle removed. Members are named by content (layers and configs
    by digest, legacy layer folders by chain id): a name seen once is the same file everywhere."""
    key = hashlib.sha256("\n".join(a.name for a in archives).encode()).hexdigest()[:16]
    dest = cache / f"bundle-{key}.tar"
    if dest.exists():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    seen: set[str] = set()
    manifest: list[dict] = []
    repos: dict[str, dict] = {}
    with tarfile.open(tmp, "w", copybufsize=1 << 20) as out:
        for archive in archives:
            with tarfile.open(archive) as src:
                for m in src:
                    if m.name == MANIFEST:
                        manifest += json.load(src.extractfile(m))
                    elif m.name == REPOSITORIES:
                        for repo, tags in json.load(src.extractfile(m)).items():
                            repos.setdefault(repo, {}).update(tags)
                    elif m.name not in seen:
                        seen.add(m.name)
                        out.addfile(m, src.extractfile(m) if m.isfile() else None)
        for name, doc in ((MANIFEST, manifest), (REPOSITORIES, repos)):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o444
            out.addfile(info, io.BytesIO(data))
    tmp.rename(dest)
    for old in cache.glob("bundle-*.tar"):
        if old != dest:
            old.unlink()
    return dest
