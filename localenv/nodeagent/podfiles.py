"""Where pods' files are under the agent's workdir: the agent writes them, the tests' NodeAgent
reads them (there is no `kubectl logs` or exec without a kubelet API).

    pods/<ns>_<pod>/pid                               pid of the running process group's leader
    pods/<ns>_<pod>/<container>.<uid8>.<restart>.log  stdout+stderr of one run
    pods/<ns>_<pod>/<uid8>/                           root, emptyDirs and volume files of one pod
    volumes/<ns>/<claim>/                             the data of a PersistentVolumeClaim
"""

from __future__ import annotations

from pathlib import Path

from localenv import daemon


def pod_dir_name(namespace: str, name: str) -> str:
    return f"{namespace}_{name}"


def pod_dir(workdir: Path, namespace: str, name: str) -> Path:
    return Path(workdir) / "pods" / pod_dir_name(namespace, name)


def claim_dir(workdir: Path, namespace: str, claim: str) -> Path:
    return Path(workdir) / "volumes" / namespace / claim


def log_file(pod_dir: Path, container: str, uid: str, restart: int) -> Path:
    return pod_dir / f"{container}.{uid[:8]}.{restart}.log"


def read_logs(pod_dir: Path) -> str:
    """Every run's log, oldest first."""
    files = sorted(pod_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)
    return "".join(f"=== {f.name}\n" + f.read_text(errors="replace") for f in files)


def write_pid(pod_dir: Path, uid: str, pid: int) -> None:
    tmp = pod_dir / f"pid.{uid[:8]}.tmp"
    tmp.write_text(str(pid))
    tmp.replace(pod_dir / "pid")


def drop_pid(pod_dir: Path, pid: int) -> None:
    # a recreated pod with the same name may already own the file
    f = pod_dir / "pid"
    try:
        if f.read_text().strip() == str(pid):
            f.unlink()
    except FileNotFoundError:
        pass


def read_pid(pod_dir: Path) -> int | None:
    try:
        return int((pod_dir / "pid").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def kill_leftover_groups(workdir: Path) -> None:
    daemon.kill_groups((Path(workdir) / "pods").glob("*/pid"))
