"""The Spark-operator stand-in honours the SparkApplication's volumes as a kubelet would (pure parts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localenv.sparkdriver import submit_command
from localenv.sparkrunner import Pending, app_mounts


def _app(volumes, driver_mounts, executor_mounts=()):
    conf = {"checkpoint_location": "/var/lib/eopipe/checkpoints/p", "sink": {"path": "/var/lib/eopipe/out"}}
    return {"metadata": {"name": "p-spark", "namespace": "ns"},
            "spec": {"mainApplicationFile": "local:///opt/eopipe/spark_app/main.py",
                     "arguments": ["--config-json", json.dumps(conf)], "volumes": volumes,
                     "driver": {"volumeMounts": list(driver_mounts),
                                "env": [{"name": "OUT", "value": "/var/lib/eopipe/out"}]},
                     "executor": {"volumeMounts": list(executor_mounts)}}}


CLAIM = [{"name": "checkpoint", "persistentVolumeClaim": {"claimName": "p-spark-checkpoint"}}]
MOUNT = [{"name": "checkpoint", "mountPath": "/var/lib/eopipe"}]


@pytest.mark.parametrize("volumes, driver, executor, bound, expect", [
    # (volumes, mounts, the claim's PV directory) -> mountPath -> directory, or the error
    (CLAIM, MOUNT, (), True, {"/var/lib/eopipe": "pv"}),
    (CLAIM, MOUNT, MOUNT, True, {"/var/lib/eopipe": "pv"}),  # one process: the executors' mount is the same
    (CLAIM, MOUNT, (), False, Pending),  # an unbound claim: the driver pod would be Pending
    ([{"name": "scratch", "emptyDir": {}}], [{"name": "scratch", "mountPath": "/tmp/s"}], (), True,
     {"/tmp/s": "empty/scratch"}),
    ([], MOUNT, (), True, ValueError),  # a mount without its volume
    ([{"name": "checkpoint", "nfs": {"server": "x"}}], MOUNT, (), True, ValueError),
    ([], (), (), True, {}),  # nothing mounted: nothing rewritten
])
def test_app_mounts(tmp_path, volumes, driver, executor, bound, expect):
    def pv_path(claim):
        assert claim == "p-spark-checkpoint"
        return str(tmp_path / "pv") if bound else None
    app = _app(volumes, driver, executor)
    if isinstance(expect, type):
        with pytest.raises(expect):
            app_mounts(app, pv_path, tmp_path / "empty")
        return
    assert app_mounts(app, pv_path, tmp_path / "empty") == {k: str(tmp_path / v) for k, v in expect.items()}


def test_mounted_paths_point_at_the_volume_and_nothing_else_moves(tmp_path):
    app = _app(CLAIM, MOUNT)
    argv, env = submit_command(app, None, mounts={"/var/lib/eopipe": str(tmp_path / "pv")})
    conf = json.loads(argv[-1])
    assert conf["checkpoint_location"] == str(tmp_path / "pv" / "checkpoints" / "p")
    assert env["OUT"] == str(tmp_path / "pv" / "out")
    argv, _ = submit_command(app, None)  # without mounts the path stays the container's
    assert json.loads(argv[-1])["checkpoint_location"] == "/var/lib/eopipe/checkpoints/p"
    assert Path(argv[-3]).name == "main.py"
