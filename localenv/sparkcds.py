"""Class data sharing for the Spark drivers the tests run on this host, as the Spark image's
entrypoint has its drivers share classes (docs/design.md#spark-start): the archive is made by
that entrypoint's own `cds-dump` over this host's pyspark, once per pyspark, Java and training
run (cached under $EOPIPE_CACHE), and a driver maps it the entrypoint's way: SPARK_SUBMIT_OPTS,
pyspark's jars first on its class path, one by one, sorted."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from localenv import CACHE, REPO_ROOT, quick_jit

ENTRYPOINT = REPO_ROOT / "hack" / "spark" / "entrypoint.sh"
TRAINING = REPO_ROOT / "hack" / "spark" / "cds-train.py"
# The JVM takes an archive only with the class path it was dumped with, each jar's path, size
# and mtime; pip writes pyspark's jars at install time, so every fresh venv (each CI run) would
# dump it again (about a minute). Their mtimes are set to a fixed time first (a wheel's earliest):
# a fresh venv of the same pyspark at the same path then maps the cached archive.
JAR_MTIME = 315532800


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def jars_classpath(home: Path) -> str:
    """The entrypoint's class path: the jars sorted by name, bytewise (its LC_ALL=C glob)."""
    return ":".join(str(p) for p in sorted((home / "jars").glob("*.jar")))


def archive(kafka_jars: Path) -> Path:
    """The archive for this host's pyspark and Java, made once (about a minute); the
    training run's Kafka source comes from `kafka_jars` (hack/fetch-spark-jars.sh)."""
    home = _spark_home()
    jars = sorted((home / "jars").glob("*.jar"))
    for jar in jars:
        if jar.stat().st_mtime != JAR_MTIME:
            os.utime(jar, (JAR_MTIME, JAR_MTIME))
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True).stderr
    facts = [java, ENTRYPOINT.read_text(), TRAINING.read_text(),
             *(f"{p} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in jars)]
    out = CACHE / f"spark-cds-{hashlib.sha256(chr(0).join(facts).encode()).hexdigest()[:16]}" / "spark.jsa"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one dump, whoever asks first
        if not out.exists():
            part = out.with_suffix(".part")
            part.unlink(missing_ok=True)
            env = {**os.environ, "SPARK_HOME": str(home), "EOPIPE_SPARK_CDS_ARCHIVE": str(part),
                   "PYSPARK_PYTHON": sys.executable, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            env.pop("PYSPARK_GATEWAY_PORT", None)
            kafka = ",".join(str(p) for p in sorted(Path(kafka_jars).glob("*.jar")))
            with tempfile.TemporaryDirectory() as tmp:
                res = subprocess.run(["bash", str(ENTRYPOINT), "cds-dump", "--jars", kafka, str(TRAINING)], env=env,
                                     cwd=tmp, capture_output=True, text=True, timeout=600, check=False)
            if res.returncode != 0:
                raise RuntimeError(f"the class data sharing dump failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
            part.rename(out)
            _prune(out.parent)
    return out


def _prune(kept: Path, others: int = 2) -> None:
    """All but the `others` newest other archives removed (163 MB each): one per checkout path
    is current, and a changed pyspark, Java or training run leaves the old one unused."""
    old = sorted((d for d in CACHE.glob("spark-cds-*") if d != kept), key=lambda d: d.stat().st_mtime)
    for d in old[:-others] if others else old:
        shutil.rmtree(d, ignore_errors=True)


def driver_env(archive_path: Path) -> dict[str, str]:
    """The environment that has a `python -m spark_app.main` driver (pyspark launches its JVM
    through spark-submit) map the archive."""
    cp = jars_classpath(_spark_home())
    return {"SPARK_SUBMIT_OPTS": " ".join([f"-XX:SharedArchiveFile={archive_path}", *quick_jit()]),
            "PYSPARK_SUBMIT_ARGS": f"--conf spark.driver.extraClassPath={cp} pyspark-shell"}
