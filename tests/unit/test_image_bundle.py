"""localenv/node/imagebundle.py: docker-archives merged with each member once, as `docker save`
of several images writes them; the nodes import the result (a node that could not would never
be Ready, so every node-tier test checks containerd takes it)."""

import io
import json
import tarfile

from localenv.node.imagebundle import bundle


def _archive(path, tag, layers):
    """A docker-archive as buildah writes it: layers and config by digest, manifest, repositories."""
    with tarfile.open(path, "w") as t:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for digest, data in layers:
            add(f"{digest}.tar", data)
        add(f"cfg-{tag}.json", b"{}")
        repo, version = tag.rsplit(":", 1)
        add("manifest.json", json.dumps([{"Config": f"cfg-{tag}.json", "RepoTags": [tag],
                                           "Layers": [f"{d}.tar" for d, _ in layers]}]).encode())
        add("repositories", json.dumps({repo: {version: "id"}}).encode())
    return path


def _members(path):
    with tarfile.open(path) as t:
        return {m.name: t.extractfile(m).read() for m in t}


def test_shared_layers_once_both_images_listed(tmp_path):
    base = ("aa", b"base layer")
    a = _archive(tmp_path / "spark-1.tar", "localhost/spark:1", [base, ("bb", b"spark")])
    b = _archive(tmp_path / "operator-2.tar", "localhost/operator:2", [base, ("bb", b"spark"), ("cc", b"bin")])
    out = bundle([a, b], tmp_path / "cache")
    got = _members(out)
    assert sorted(got) == ["aa.tar", "bb.tar", "cc.tar", "cfg-localhost/operator:2.json",
                           "cfg-localhost/spark:1.json", "manifest.json", "repositories"]
    assert [m["RepoTags"] for m in json.loads(got["manifest.json"])] == [["localhost/spark:1"],
                                                                          ["localhost/operator:2"]]
    assert json.loads(got["manifest.json"])[1]["Layers"] == ["aa.tar", "bb.tar", "cc.tar"]
    assert json.loads(got["repositories"]) == {"localhost/spark": {"1": "id"}, "localhost/operator": {"2": "id"}}
    assert got["aa.tar"] == b"base layer"


def test_cached_by_the_archives_and_the_older_bundle_removed(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    a = _archive(tmp_path / "a-1.tar", "localhost/a:1", [("aa", b"x")])
    b = _archive(tmp_path / "b-1.tar", "localhost/b:1", [("bb", b"y")])
    first = bundle([a, b], cache)
    stamp = first.stat().st_mtime_ns
    assert bundle([a, b], cache) == first and first.stat().st_mtime_ns == stamp  # not written again
    c = _archive(tmp_path / "b-2.tar", "localhost/b:2", [("cc", b"z")])
    second = bundle([a, c], cache)
    assert second != first and not first.exists() and sorted(p.name for p in cache.iterdir()) == [second.name]
