"""Whether the cluster's SparkApplication CRD is one eopipe runs on (control/sparkcrd.py)."""

import logging
from pathlib import Path

import pytest
import yaml

from eopipe.control.sparkcrd import CRD_NAME, judge, startup_line

LOCAL_CRD = Path(__file__).resolve().parents[2] / "localenv" / "crds" / f"{CRD_NAME}.yaml"


def _crd(*versions):
    return {"metadata": {"name": CRD_NAME}, "spec": {"versions": list(versions)}}


def _version(name="v1beta2", served=True, driver=("template",), executor=("template",), preserve=False):
    def role(fields):
        return {"type": "object", "properties": {f: {"type": "object"} for f in fields}}
    spec = {"type": "object", "properties": {"driver": role(driver), "executor": role(executor)}}
    if preserve:
        spec = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {"name": name, "served": served, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}}}


@pytest.mark.parametrize(("crd", "reason", "words"), [
    (_crd(_version()), None, None),
    (_crd({**_version("v1beta1"), "storage": False}, _version()), None, None),  # an older version too
    (_crd(_version(preserve=True)), None, None),                      # unknown fields kept: templates too
    (None, "SparkOperatorMissing", "no CustomResourceDefinition sparkapplications.sparkoperator.k8s.io"),
    (_crd(_version("v1beta1")), "SparkOperatorMissing", "serves v1beta1, not v1beta2"),
    (_crd(_version(served=False)), "SparkOperatorMissing", "serves none, not v1beta2"),
    (_crd(_version(driver=("cores",))), "SparkOperatorMissing", "has no spec.driver.template"),
    (_crd(_version(driver=(), executor=())), "SparkOperatorMissing", "no spec.driver/executor.template"),
])
def test_judge(crd, reason, words):
    got = judge(crd)
    if reason is None:
        assert got is None
        return
    assert (got.type, got.status, got.reason) == ("ProcessingReady", False, reason)
    assert words in got.message and "v2.5.2" in got.message


def test_the_process_tiers_crd_passes():
    crd = next(d for d in yaml.safe_load_all(LOCAL_CRD.read_text()) if d)
    assert judge(crd) is None


@pytest.mark.parametrize(("crd", "level", "words"), [
    (_crd(_version()), logging.INFO, "Spark stages can run"),
    (None, logging.WARNING, "no pipeline's Spark stage can run until this is fixed: the cluster has no"),
])
def test_what_the_operator_says_at_start(crd, level, words):
    got_level, line = startup_line(judge(crd))
    assert got_level == level and words in line
