"""The node tier's images, built with no registry and cached by a content hash of their inputs
under $EOPIPE_CACHE/node-images (docs/design.md#the-local-environment):

- pause: localenv/node/pause/main.go built static, the image's only file; CoreDNS,
  local-path-provisioner and kube-network-policies (hack/build-tools.sh) the same way.
- base: `mmdebstrap --variant=minbase bookworm` with python3, python3-venv and python3-dev (the
  C headers the python image has), and a venv on PATH (Debian's python refuses pip installs
  outside one, PEP 668). It stands in for the python slim image a user's build starts FROM.
- eopipe: the project's Dockerfile (target operator), built by `buildah bud` with
  PYTHON_IMAGE=<base>; eopipe-spark the same (target spark).
- eopipe-spark-operator: the Kubeflow Spark Operator's binary (hack/build-tools.sh
  spark-operator) on the Spark image, as upstream's image puts it on Spark's: the controller runs
  spark-submit (Java, $SPARK_HOME) in its own container. Entrypoint as upstream's: tini, then
  /usr/bin/spark-operator (its nss_wrapper step is not needed: the image's user 10001 has a
  passwd entry).

buildah keeps its images in its own store under the cache (vfs driver: it mounts nothing);
each image ends as a docker-archive that `ctr -n k8s.io images import` loads into the node.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from localenv import CACHE as EOPIPE_CACHE
from localenv import REPO_ROOT

CACHE = EOPIPE_CACHE / "node-images"
PAUSE_SRC = Path(__file__).resolve().parent / "pause" / "main.go"
# python3-dev: the python image a user's build starts FROM has Python's C headers.
BASE_SUITE, BASE_PACKAGES = "bookworm", ("python3", "python3-venv", "python3-dev")
VENV = "/opt/venv"
# What the Dockerfile's build context contributes (its COPY sources); a change rebuilds.
APP_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "operator", "spark_app")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_JAVA_TRUST = Path("/etc/ssl/certs/java/cacerts")
BUILD_JAVA_TRUST = "/run/eopipe-build/cacerts"
SPARK_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "spark_app", "hack/lib.sh",
                "hack/fetch-spark-jars.sh", "hack/fetch-hadoop-aws.sh", "hack/spark-version.sh", "hack/spark/pom.xml",
                "hack/spark/hadoop-aws-pom.xml", "hack/spark/entrypoint.sh", "hack/spark/cds-train.py")
ADDONS = ("coredns", "local-path-provisioner", "kube-network-policies")
SPARK_OPERATOR_BIN = "/usr/bin/spark-operator"


def archive_path(ref: str) -> Path:
    """Where the docker-archive of `ref` is cached."""
    return CACHE / f"{ref.split('/')[-1].replace(':', '-')}.tar"


def _hash(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def tree_hash(root: Path, inputs: tuple[str, ...]) -> str:
    """Content hash of the files under `inputs` (relative to root), names included; caches,
    bytecode and the host's build of the compiled hot path (.dockerignore'd) left out."""
    parts: list[bytes] = []
    for name in inputs:
        p = root / name
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            rel = f.relative_to(root).as_posix()
            cython_output = f.suffix == ".c" and f.with_suffix(".pyx").exists()  # made by each build
            if "__pycache__" in rel or ".egg-info" in rel or rel.endswith((".pyc", ".so")) or cython_output:
                continue
            parts += [rel.encode(), f.read_bytes()]
    return _hash(*parts)


def _log(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


class Buildah:
    def __init__(self, cache: Path = CACHE):
        self.root = cache / "storage"
        # buildah's network backend would otherwise create /etc/cni/net.d (builds use the host
        # network: it configures nothing there).
        conf = cache / "containers.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(f'[network]\nnetwork_config_dir = "{cache / "cni"}"\n')
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def __call__(self, *args: str, capture: bool = False) -> str:
        argv = ["buildah", "--root", str(self.root), "--runroot", str(self.root) + "-run",
                "--storage-driver", "vfs", *args]
        res = subprocess.run(argv, check=True, text=True, env=self.env,
                             stdout=subprocess.PIPE if capture else sys.stderr)
        return (res.stdout or "").strip()

    def has_image(self, ref: str) -> bool:
        argv = ["buildah", "--root", str(self.root), "--runroot", str(self.root) + "-run",
                "--storage-driver", "vfs", "inspect", "--type", "image", ref]
        return subprocess.run(argv, check=False, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0

    def archive(self, ref: str, dest: Path) -> Path:
        """docker-archive of `ref` at dest (written beside it, then renamed: never half a file)."""
        tmp = dest.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        self("push", "--quiet", ref, f"docker-archive:{tmp}:{ref}")
        tmp.rename(dest)
        return dest


def _binary_image(b: Buildah, name: str, binary: Path, key: str) -> tuple[str, Path]:
    """An image whose only file is one static binary, its entrypoint, run as 65535 (the pause
    image, and the node's add-ons: CoreDNS, local-path-provisioner, kube-network-policies, whose
    DaemonSet runs it as root). Cached by `key`."""
    ref = f"localhost/eopipe-{name}:{key}"
    dest = archive_path(ref)
    if dest.exists():
        return ref, dest
    _log(f"building {ref}")
    ctr = b("from", "--quiet", "scratch", capture=True)
    try:
        b("copy", "--quiet", ctr, str(binary), f"/{name}")
        b("config", "--entrypoint", f'["/{name}"]', "--user", "65535:65535", ctr)
        b("commit", "--quiet", ctr, ref)
    finally:
        b("rm", ctr)
    return ref, b.archive(ref, dest)


def pause_image(b: Buildah) -> tuple[str, Path]:
    go = subprocess.run(["go", "env", "GOVERSION"], check=True, text=True, stdout=subprocess.PIPE).stdout
    key = _hash(PAUSE_SRC.read_bytes(), go.encode())
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        if not (CACHE / f"eopipe-pause-{key}.tar").exists():
            subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), str(PAUSE_SRC)],
                           check=True, env={**os.environ, "CGO_ENABLED": "0", "GO111MODULE": "off"})
        return _binary_image(b, "pause", binary, key)


def addon_images(b: Buildah) -> dict[str, tuple[str, Path]]:
    """CoreDNS, local-path-provisioner and kube-network-policies from hack/build-tools.sh
    (cached by version), each in an image keyed by the hash of its binary."""
    out = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-tools.sh"), *ADDONS], check=True, text=True,
                         stdout=subprocess.PIPE).stdout.split()
    images = {}
    for name, bin_dir in zip(ADDONS, out):
        images[name] = binary_image(b, name, Path(bin_dir) / name)
    return images


def binary_image(b: Buildah, name: str, binary: Path) -> tuple[str, Path]:
    """The one-binary image of `binary`, keyed by its hash (the add-ons; the object store's
    `weed`, localenv/node/objectstore.py)."""
    return _binary_image(b, name, binary, _hash(binary.read_bytes()))


def base_image(b: Buildah) -> str:
    """The base's ref in buildah's store (the app image builds FROM it)."""
    recipe = f"mmdebstrap --variant=minbase {BASE_SUITE} {','.join(BASE_PACKAGES)}; venv {VENV}"
    ref = f"localhost/eopipe-base:{_hash(recipe.encode())}"
    if b.has_image(ref):
        return ref
    _log(f"building {ref}: {recipe}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                        BASE_SUITE, str(rootfs)], check=True)
        ctr = b("from", "--quiet", "scratch", capture=True)
        try:
            b("add", "--quiet", ctr, str(rootfs), "/")
            # python3 -m venv installs pip from wheels Debian ships: nothing is downloaded.
            b("run", "--isolation", "chroot", "--network", "host", ctr, "--", "python3", "-m", "venv", VENV)
            b("config", "--env", f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "--cmd", "python3", ctr)
            b("commit", "--quiet", ctr, ref)
        finally:
            b("rm", ctr)
    return ref


def _trust_args() -> list[str]:
    """This machine's TLS-inspecting proxy: the host's CA bundle for pip and its Java trust store
    for Maven, mounted read-only into the build's RUN steps and named by build arguments, which
    stay out of the images."""
    args = []
    if HOST_CA.exists():
        args += ["--volume", f"{HOST_CA}:{HOST_CA}:ro", "--build-arg", f"PIP_CERT={HOST_CA}"]
    if HOST_JAVA_TRUST.exists():
        args += ["--volume", f"{HOST_JAVA_TRUST}:{BUILD_JAVA_TRUST}:ro",
                 "--build-arg", f"MAVEN_OPTS=-Djavax.net.ssl.trustStore={BUILD_JAVA_TRUST}"]
    return args


def dockerfile_image(b: Buildah, target: str, inputs: tuple[str, ...]) -> tuple[str, Path]:
    """A target of the project's Dockerfile on the mmdebstrap base, tagged by a hash of the base
    and of the inputs (the build context the target copies)."""
    base = base_image(b)
    name = "eopipe" if target == "operator" else f"eopipe-{target}"
    ref = f"localhost/{name}:{_hash(base.encode(), target.encode(), tree_hash(REPO_ROOT, inputs).encode())}"
    return _bud(b, base, target, ref, name, lambda: REPO_ROOT)


def _bud(b: Buildah, base: str, target: str, ref: str, name: str, context) -> tuple[str, Path]:
    """`buildah bud` of the Dockerfile target in the directory context() gives (called only when
    the archive is not cached), archived; older images of `name` pruned."""
    dest = archive_path(ref)
    if dest.exists():
        return ref, dest
    _log(f"building {ref} from the Dockerfile, target {target} (FROM {base})")
    t0 = time.monotonic()
    root = context()
    b("bud", "--quiet", "--isolation", "chroot", "--network", "host", "--pull=never", "--layers=false",
      "--build-arg", f"PYTHON_IMAGE={base}", "--target", target, *_trust_args(),
      "-f", str(root / "Dockerfile"), "-t", ref, str(root))
    _log(f"{ref} built in {time.monotonic() - t0:.0f}s")
    b.archive(ref, dest)
    _prune(b, name, ref, dest)
    return ref, dest


def commit_app_image(commit: str) -> tuple[str, Path]:
    """The operator/dedup image as of `commit` (full hash): the same build on `git archive` of
    that tree, tagged by the base and the commit, so a warm cache never extracts or builds it
    again (the upgrade test's earlier operator). Kept apart from the current image's name, which
    the prune would otherwise remove."""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"a full commit hash, not {commit!r}")
    CACHE.mkdir(parents=True, exist_ok=True)
    b = Buildah()
    base = base_image(b)
    name = "eopipe-prev"
    ref = f"localhost/{name}:{_hash(base.encode(), b'operator', commit.encode())}"
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        return _bud(b, base, "operator", ref, name, lambda: tree_at(commit, Path(tmp)))


# What the Spark image holds besides spark_app: Spark and its jars (the pyspark pin, the Maven
# poms and the scripts that run them), Java and the entrypoint (the Dockerfile).
SPARK_RUNTIME = ("Dockerfile", "hack/lib.sh", "hack/fetch-spark-jars.sh", "hack/fetch-hadoop-aws.sh",
                 "hack/spark/pom.xml", "hack/spark/hadoop-aws-pom.xml", "hack/spark/entrypoint.sh", "hack/spark/cds-train.py")
_PYSPARK_PIN = re.compile(r'"pyspark==[^"]+"')


def commit_spark_image(commit: str, current: str) -> tuple[str, Path]:
    """The Spark image as of `commit` (full hash), for the upgrade test's earlier Spark stage.
    While the pyspark pin and SPARK_RUNTIME are the same at both commits, only spark_app differs:
    `current` (this tree's Spark image, in buildah's store) with that commit's spark_app, built
    in seconds. Otherwise the Dockerfile's spark target on `git archive` of that tree, as
    commit_app_image does (minutes, once: cached by the base and the commit)."""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"a full commit hash, not {commit!r}")
    changed = subprocess.run(["git", "-C", str(REPO_ROOT), "diff", "--name-only", commit, "--", *SPARK_RUNTIME],
                             check=True, capture_output=True, text=True).stdout.split()
    pins = {_PYSPARK_PIN.findall(text)[0] for text in (
        subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"{commit}:pyproject.toml"], check=True,
                       capture_output=True, text=True).stdout, (REPO_ROOT / "pyproject.toml").read_text())}
    CACHE.mkdir(parents=True, exist_ok=True)
    b, name = Buildah(), "eopipe-spark-prev"
    if changed or len(pins) != 1:
        _log(f"the Spark image as of {commit[:12]} differs from this tree's in more than spark_app "
             f"({', '.join(changed + (sorted(pins) if len(pins) > 1 else []))}): a full build")
        base = base_image(b)
        ref = f"localhost/{name}:{_hash(base.encode(), b'spark', commit.encode())}"
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            return _bud(b, base, "spark", ref, name, lambda: tree_at(commit, Path(tmp)))
    ref = f"localhost/{name}:{_hash(current.encode(), b'spark_app', commit.encode())}"
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        def steps(ctr: str) -> None:
            b("run", "--isolation", "chroot", "--user", "0:0", ctr, "--", "rm", "-rf", "/opt/eopipe/spark_app")
            b("copy", "--quiet", ctr, str(tree_at(commit, Path(tmp), "spark_app") / "spark_app"), "/opt/eopipe/spark_app")
        return _on_top(b, (current, archive_path(current)), ref, name, steps)


def tree_at(commit: str, dest: Path, *paths: str) -> Path:
    """The repository's files (or those under `paths`) as of `commit`, written into `dest`."""
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit, *paths], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def app_image(b: Buildah) -> tuple[str, Path]:
    """The operator/dedup image."""
    return dockerfile_image(b, "operator", APP_INPUTS)


def spark_image(b: Buildah) -> tuple[str, Path]:
    """The Spark image: Java, pyspark, the Kafka connector jars (Maven), spark_app."""
    return dockerfile_image(b, "spark", SPARK_INPUTS)


def spark_operator_image(b: Buildah, spark: tuple[str, Path]) -> tuple[str, Path]:
    """The Spark image plus the operator's binary, keyed by both (module docstring)."""
    out = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-tools.sh"), "spark-operator"], check=True,
                         text=True, stdout=subprocess.PIPE).stdout.split()
    binary = Path(out[-1]) / "spark-operator"
    spark_ref = spark[0]
    name = "eopipe-spark-operator"
    ref = f"localhost/{name}:{_hash(spark_ref.encode(), binary.read_bytes(), SPARK_OPERATOR_BIN.encode())}"
    def steps(ctr: str) -> None:
        b("copy", "--quiet", "--chmod", "0755", ctr, str(binary), SPARK_OPERATOR_BIN)
        b("config", "--entrypoint", json.dumps(["/usr/bin/tini", "-s", "--", SPARK_OPERATOR_BIN]), ctr)
    return _on_top(b, spark, ref, name, steps)


def _on_top(b: Buildah, under: tuple[str, Path], ref: str, name: str, steps) -> tuple[str, Path]:
    """`ref`: the image `under` (ref, archive) with what steps(container) does, archived and
    cached; older images of `name` pruned."""
    dest = archive_path(ref)
    if dest.exists():
        return ref, dest
    _log(f"building {ref} FROM {under[0]}")
    if not b.has_image(under[0]):  # the archive outlived buildah's store
        b("pull", "--quiet", f"docker-archive:{under[1]}")
    ctr = b("from", "--quiet", "--pull=never", under[0], capture=True)
    try:
        steps(ctr)
        b("commit", "--quiet", ctr, ref)
    finally:
        b("rm", ctr)
    b.archive(ref, dest)
    _prune(b, name, ref, dest)
    return ref, dest


def _prune(b: Buildah, name: str, ref: str, dest: Path) -> None:
    """Only the newest image of a name is kept (each is hundreds of MB, and every source change
    makes one)."""
    for old in CACHE.glob(f"{name}-*.tar"):
        if re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{16}}\.tar", old.name) and old != dest:
            old.unlink()
    repo = ref.rsplit(":", 1)[0]
    for line in b("images", "--noheading", "--format", "{{.Name}}:{{.Tag}}", capture=True).splitlines():
        if line.rsplit(":", 1)[0] == repo and line != ref:
            b("rmi", line)


def base_archive(b: Buildah) -> tuple[str, Path]:
    """The base as an image of the node: local-path-provisioner's helper pods run its shell."""
    ref = base_image(b)
    dest = archive_path(ref)
    return ref, dest if dest.exists() else b.archive(ref, dest)


def ensure_images(app: bool = True, spark: bool = False) -> dict[str, tuple[str, Path]]:
    """{"pause", "base", *ADDONS, "app", "spark", "spark-operator"}: (ref, archive),
    built once, then from the cache. Without app, only what a Ready node with its add-ons needs."""
    CACHE.mkdir(parents=True, exist_ok=True)
    b = Buildah()
    out = {"pause": pause_image(b), "base": base_archive(b), **addon_images(b)}
    if app:
        out["app"] = app_image(b)
    if spark:
        out["spark"] = spark_image(b)
        out["spark-operator"] = spark_operator_image(b, out["spark"])
    return out


def import_images(ctr: list[str], archives: list[Path]) -> None:
    """Loads the archives into containerd's k8s.io namespace (the CRI plugin's)."""
    for a in archives:
        subprocess.run([*ctr, "-n", "k8s.io", "images", "import", "--no-unpack=false", str(a)],
                       check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    for name, (ref, path) in ensure_images(spark="--spark" in sys.argv).items():
        print(f"{name}\t{ref}\t{path}")
