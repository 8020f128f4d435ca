"""Static checks of the Dockerfile. No Docker engine runs on the test machines, so the images
are never built here: this parses the Dockerfile and checks what can be checked without one
(stages and targets, COPY sources, non-root users, registry-only downloads, version pins).
What it cannot check: that the build succeeds and the images run (see docs/install.md)."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
TARGETS = ("operator", "spark")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Dockerfile -> (global ARGs, stages). Joins continuation lines, drops comments."""
    lines, buf = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") and not buf:
            continue
        if raw.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        if buf.strip():
            lines.append(buf.strip())
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.I)
            assert m, f"cannot parse FROM {rest}"
            stages.append(Stage(name=(m.group(2) or str(len(stages))).lower(), base=m.group(1)))
        elif not stages:
            assert op == "ARG", f"{op} before the first FROM"
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        else:
            stages[-1].instructions.append((op, rest.strip()))
    return args, stages


@pytest.fixture(scope="module")
def dockerfile():
    return parse(DOCKERFILE.read_text())


def _stage(stages: list[Stage], name: str) -> Stage:
    return next(s for s in stages if s.name == name)


def _chain(stages: list[Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM (nearest first)."""
    names = {s.name for s in stages}
    out = [_stage(stages, name)]
    while out[-1].base.lower() in names:
        out.append(_stage(stages, out[-1].base.lower()))
    return out


def _copy_sources(rest: str) -> tuple[str | None, list[str]]:
    """COPY [--from=x] [--chown=..] src... dest -> (from, sources)."""
    if rest.startswith("["):
        import json
        parts = json.loads(rest)
        flags = []
    else:
        parts = shlex.split(rest)
        flags = [p for p in parts if p.startswith("--")]
        parts = [p for p in parts if not p.startswith("--")]
    frm = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
    return frm, parts[:-1]


def test_stages_and_targets(dockerfile):
    _, stages = dockerfile
    names = [s.name for s in stages]
    assert len(names) == len(set(names)), names
    for target in TARGETS:
        assert target in names
    assert {"builder", "spark-jars"} <= set(names)
    # `docker build .` without --target builds the last stage: the operator image.
    assert names[-1] == "operator"


def test_base_images_are_pinned(dockerfile):
    args, stages = dockerfile
    names = {s.name for s in stages}
    for s in stages:
        base = s.base
        for name, default in args.items():
            base = base.replace("${%s}" % name, default)
        if base.lower() in names:
            continue
        assert ":" in base and not base.endswith(":latest"), f"stage {s.name}: unpinned base {base}"


def test_every_copy_source_exists_and_is_in_the_build_context(dockerfile):
    _, stages = dockerfile
    names = {s.name for s in stages}
    ignore = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
              if p.strip() and not p.lstrip().startswith("#")]
    for s in stages:
        for op, rest in s.instructions:
            assert op != "ADD", f"stage {s.name}: use COPY (ADD can fetch URLs): ADD {rest}"
            if op != "COPY":
                continue
            frm, sources = _copy_sources(rest)
            if frm is not None:
                assert frm.lower() in names, f"COPY --from={frm}: no such stage"
                continue
            for src in sources:
                path = ROOT / src
                assert path.exists(), f"stage {s.name}: COPY source {src} is not in the repo"
                rel = src.rstrip("/")
                for pat in ignore:
                    pat = pat.rstrip("/")
                    excluded = fnmatch.fnmatch(rel, pat) or rel.startswith(pat + "/")
                    assert not excluded, f".dockerignore pattern {pat!r} hides COPY source {src}"


def test_copied_files_are_tracked_or_new_in_git(dockerfile):
    """A COPY source that git ignores would be missing from a clean checkout."""
    _, stages = dockerfile
    for s in stages:
        for op, rest in s.instructions:
            if op == "COPY":
                frm, sources = _copy_sources(rest)
                for src in sources if frm is None else ():
                    res = subprocess.run(["git", "check-ignore", "-q", src], cwd=ROOT)
                    assert res.returncode == 1, f"{src} is ignored by git"


@pytest.mark.parametrize("target", TARGETS)
def test_final_images_run_as_non_root(dockerfile, target):
    _, stages = dockerfile
    user = None
    for s in _chain(stages, target):  # nearest stage first: its USER wins
        users = [rest for op, rest in s.instructions if op == "USER"]
        if users:
            user = users[-1]
            break
    assert user is not None, f"target {target} sets no USER"
    name = user.split(":")[0]
    assert name not in ("root", "0"), f"target {target} runs as {user}"
    assert name == "10001", "the dedup worker's state directory belongs to uid 10001"


def test_operator_image_entrypoint(dockerfile):
    _, stages = dockerfile
    ops = dict((op, rest) for op, rest in _stage(stages, "operator").instructions)
    assert ops["ENTRYPOINT"] == '["eopipe"]' and ops["CMD"] == '["operator"]'


def test_downloads_only_from_package_registries(dockerfile):
    _, stages = dockerfile
    for s in stages:
        for op, rest in s.instructions:
            if op != "RUN":
                continue
            assert not re.search(r"\b(curl|wget|git\s+clone)\b", rest), f"stage {s.name}: RUN {rest}"
            for script in re.findall(r"\bbash\s+(\S+\.sh)", rest):  # scripts from the repo it runs
                body = (ROOT / script).read_text()
                assert not re.search(r"\b(curl|wget)\b", body), f"{script} downloads outside the registries"
            assert "://" not in rest, f"stage {s.name}: a URL in RUN {rest}"
            for tool in re.findall(r"\b(pip|apt-get|mvn)\b\s+(\w+)", rest):
                assert tool[1] in ("install", "wheel", "update", "-B"), tool
    text = DOCKERFILE.read_text()
    assert not re.search(r"--(index-url|extra-index-url|trusted-host)", text)


def test_spark_release_is_written_once():
    """pyproject.toml's pyspark pin is the Spark release; the jars, the image and the
    SparkApplication take it from there, and no other file writes a version of its own."""
    pin = re.search(r'^spark = \["pyspark==([0-9.]+)"\]$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    res = subprocess.run(["sh", str(ROOT / "hack" / "spark-version.sh")], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == f"{pin}\n", res.stderr
    text = DOCKERFILE.read_text()
    assert not re.search(r"pyspark==[0-9]", text) and "spark-version.sh" in text
    pom = (ROOT / "hack/spark/pom.xml").read_text()
    assert "<spark.version>" not in pom and "${spark.version}" in pom
    assert "spark-version.sh" in (ROOT / "hack/fetch-spark-jars.sh").read_text()
    from eopipe.control.builders.spark import spark_version
    assert spark_version() == pin
    # The installed package's metadata (what an image without the source tree reads) is current.
    from importlib import metadata
    assert f'pyspark=={pin}; extra == "spark"' in metadata.requires("eopipe")
    for doc in ("docs/design.md", "docs/install.md"):
        named = set(re.findall(r"(?:pyspark|sparkVersion:?|Spark)\s+([0-9]+\.[0-9]+\.[0-9]+)", (ROOT / doc).read_text()))
        assert named <= {pin}, f"{doc} names Spark {named - {pin}}, the pin is {pin}"


def test_spark_pin_regex_of_the_script_rejects_other_forms(tmp_path):
    """A pin the script cannot read is an error, not an empty version."""
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[project.optional-dependencies]\nspark = ["pyspark>=4.2"]\n')
    res = subprocess.run(["sh", str(ROOT / "hack" / "spark-version.sh"), str(bad)], capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout == "" and "pyspark==" in res.stderr


def test_spark_image_layout(dockerfile):
    """spark_app where the SparkApplication's mainApplicationFile points, jars on Spark's path."""
    _, stages = dockerfile
    spark = _stage(stages, "spark")
    copies = [rest for op, rest in spark.instructions if op == "COPY"]
    assert any(c.split()[-1].rstrip("/") == "/opt/eopipe/spark_app" and c.split()[-2].rstrip("/") == "spark_app"
               for c in copies), copies
    main = re.search(r'SPARK_APP_MAIN = "local://(.+)"', (ROOT / "operator/eopipe/control/builders/spark.py").read_text())
    assert main.group(1) == "/opt/eopipe/spark_app/main.py"
    assert (ROOT / "spark_app" / "main.py").exists()
    assert any(c.startswith("--from=spark-jars") and "${SPARK_HOME}/jars/" in c for c in copies), copies


def test_spark_image_works_in_a_directory_its_user_owns(dockerfile):
    """Executors fetch the driver's files (spark_app.zip) into their working directory: a root-
    owned one fails every task with AccessDeniedException for the non-root user."""
    _, stages = dockerfile
    spark = _stage(stages, "spark")
    workdir = [rest for op, rest in spark.instructions if op == "WORKDIR"][-1].strip()
    user = [rest for op, rest in spark.instructions if op == "USER"][-1].strip()
    runs = " ".join(rest for op, rest in spark.instructions if op == "RUN")
    assert f"chown {user} {workdir}" in runs, (workdir, user, runs)


def test_spark_entrypoint_runs_plain_commands(tmp_path):
    script = ROOT / "hack" / "spark" / "entrypoint.sh"
    res = subprocess.run(["bash", str(script), "echo", "hello"], capture_output=True, text=True,
                         env={"SPARK_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "SPARK_JAVA_OPT_0": "-Da=1"})
    assert res.returncode == 0 and res.stdout == "hello\n", res.stderr


def _entrypoint(tmp_path, *args: str, archive: bool = True, props: str = "") -> dict:
    """hack/spark/entrypoint.sh with SPARK_HOME's spark-submit and PATH's java replaced by a
    script that prints what it was run with, jars made in reverse order, the archive optional."""
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    (home / "jars").mkdir()
    for name in ("z.jar", "b.jar", "a.jar"):
        (home / "jars" / name).write_bytes(b"")
    show = '#!/bin/bash\nprintf "%s\\n" "$(basename "$0")" "${SPARK_SUBMIT_OPTS:-}" "$@"\n'
    for tool in (home / "bin" / "spark-submit", tmp_path / "java"):
        tool.write_text(show)
        tool.chmod(0o755)
    jsa = tmp_path / "spark.jsa"
    if archive:
        jsa.write_bytes(b"x")
    (tmp_path / "spark.properties").write_text(props)
    res = subprocess.run(["bash", str(ROOT / "hack" / "spark" / "entrypoint.sh"), *args], capture_output=True,
                         text=True, cwd=tmp_path,
                         env={"SPARK_HOME": str(home), "PATH": f"{tmp_path}:/usr/bin:/bin",
                              "EOPIPE_SPARK_CDS_ARCHIVE": str(jsa), "SPARK_EXECUTOR_MEMORY": "1g",
                              "SPARK_DRIVER_URL": "d", "SPARK_EXECUTOR_ID": "1", "SPARK_EXECUTOR_CORES": "1",
                              "SPARK_APPLICATION_ID": "a", "SPARK_EXECUTOR_POD_IP": "10.0.0.2"})
    assert res.returncode == 0, res.stderr
    tool, opts, *argv = res.stdout.splitlines()
    return {"tool": tool, "opts": opts, "argv": argv, "jars": ":".join(str(home / "jars" / j) for j in
                                                                       ("a.jar", "b.jar", "z.jar")), "jsa": str(jsa)}


@pytest.mark.parametrize("case, archive, props, extra, uses", [
    ("driver", True, "", (), True),
    ("driver, no archive", False, "", (), False),
    # An admin let the pipeline set the class path: the JVM starts without the archive.
    ("driver, its own class path (properties)", True, "spark.driver.extraClassPath=/x.jar\n", (), False),
    ("driver, its own class path (--conf)", True, "", ("--conf", "spark.driver.extraClassPath=/x.jar"), False),
])
def test_spark_driver_maps_the_archive_with_the_jars_first_in_sorted_order(tmp_path, case, archive, props, extra, uses):
    """The archive holds for the class path it was made with, as a prefix: the jars one by one,
    sorted (a wildcard expands in directory order, which differs between filesystems)."""
    got = _entrypoint(tmp_path, "driver", "--properties-file", str(tmp_path / "spark.properties"), *extra,
                      "--class", "C", archive=archive, props=props)
    assert got["tool"] == "spark-submit"
    assert (f"-XX:SharedArchiveFile={got['jsa']}" in got["opts"]) == uses, got
    assert (f"spark.driver.extraClassPath={got['jars']}" in got["argv"]) == uses, got
    assert got["argv"][-2:] == ["--class", "C"] and "--deploy-mode" in got["argv"], got


@pytest.mark.parametrize("archive", [True, False])
def test_spark_executor_maps_the_archive_with_the_jars_in_sorted_order(tmp_path, archive):
    got = _entrypoint(tmp_path, "executor", archive=archive)
    argv = got["argv"]
    assert got["tool"] == "java" and argv[argv.index("-cp") + 1] == got["jars"], got
    assert (f"-XX:SharedArchiveFile={got['jsa']}" in argv) == archive, got


def test_spark_image_makes_the_archive_the_entrypoint_maps(dockerfile):
    """The spark stage runs the training dump after the jars are in place, at the entrypoint's
    default archive path (a dump before a jar's COPY would not hold for it)."""
    _, stages = dockerfile
    spark = _stage(stages, "spark")
    ops = [(op, rest) for op, rest in spark.instructions]
    dump = next(i for i, (op, rest) in enumerate(ops) if op == "RUN" and "entrypoint.sh cds-dump" in rest)
    jars = next(i for i, (op, rest) in enumerate(ops) if op == "COPY" and "${SPARK_HOME}/jars/" in rest)
    assert jars < dump, ops
    script = (ROOT / "hack" / "spark" / "entrypoint.sh").read_text()
    assert "EOPIPE_SPARK_CDS_ARCHIVE:-/opt/eopipe/spark.jsa}" in script
