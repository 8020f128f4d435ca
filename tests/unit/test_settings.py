"""The operator's settings come from the environment the chart sets, each variable to its field."""

import dataclasses

import pytest

from eopipe.control.settings import Settings

ENV = {
    "EOPIPE_IMAGE": ("image", "reg/eopipe:1"),
    "EOPIPE_SPARK_IMAGE": ("spark_image", "reg/eopipe-spark:1"),
    "EOPIPE_RESYNC_SECONDS": ("resync_seconds", 7.0),
    "EOPIPE_DELETE_ATTEMPTS": ("delete_attempts", 9),
    "EOPIPE_KAFKA_TIMEOUT_SECONDS": ("kafka_timeout_seconds", 4.0),
    "EOPIPE_REBALANCE_POLL_SECONDS": ("rebalance_poll_seconds", 3.0),
    "EOPIPE_HANGING_TRANSACTION_SECONDS": ("hanging_transaction_seconds", 15.0),
    "EOPIPE_AUTOSCALE_SECONDS": ("autoscale_seconds", 5.0),
    "EOPIPE_NODE_LOST_SECONDS": ("node_lost_seconds", 30.0),
    "EOPIPE_LEADER_ELECTION": ("leader_election", True),
    "EOPIPE_LEASE_NAME": ("lease_name", "my-lease"),
    "EOPIPE_LEASE_NAMESPACE": ("lease_namespace", "ops"),
    "POD_NAMESPACE": ("lease_namespace", "eopipe-system"),
    "POD_NAME": ("identity", "eopipe-7c9f-abcde"),
    "EOPIPE_LEASE_DURATION_SECONDS": ("lease_duration_seconds", 6.0),
    "EOPIPE_RENEW_DEADLINE_SECONDS": ("renew_deadline_seconds", 4.0),
    "EOPIPE_RETRY_PERIOD_SECONDS": ("retry_period_seconds", 0.5),
    "EOPIPE_SPARK_DRIVER_CLUSTERROLE": ("spark_driver_cluster_role", "ops-eopipe-spark-driver"),
}


@pytest.mark.parametrize("var", sorted(ENV))
def test_each_variable_sets_its_field(var):
    field, value = ENV[var]
    got = Settings.from_env({var: str(value)})
    assert getattr(got, field) == value
    others = {f.name for f in dataclasses.fields(Settings)} - {field}
    assert all(getattr(got, f) == getattr(Settings(), f) for f in others)


def test_every_field_but_the_namespaces_has_a_variable():
    # The access-control fields take several variables each: tests/unit/test_access.py; the tenant
    # policy is one JSON variable, below.
    fields = {f.name for f in dataclasses.fields(Settings)} - {"namespaces", "allowed_registries", "network_policy",
                                                                "tenant_policy"}
    assert fields == {field for field, _ in ENV.values()}


def test_the_tenant_policy_is_one_json_variable():
    got = Settings.from_env({"EOPIPE_TENANT_POLICY": '{"spark": {"serviceAccounts": ["spark-s3"]}, "maxStorage": "1Ti"}'})
    assert got.tenant_policy.spark.service_accounts == ("spark-s3",) and got.tenant_policy.max_storage == "1Ti"
    assert Settings.from_env({}).tenant_policy == Settings().tenant_policy
    with pytest.raises(ValueError, match="EOPIPE_TENANT_POLICY: tenantPolicy.spark.serviceAccounts"):
        Settings.from_env({"EOPIPE_TENANT_POLICY": '{"spark": {"serviceAccounts": 1}}'})


def test_the_lease_namespace_variable_wins_over_the_pods():
    got = Settings.from_env({"EOPIPE_LEASE_NAMESPACE": "ops", "POD_NAMESPACE": "eopipe-system"})
    assert got.lease_namespace == "ops"


@pytest.mark.parametrize("env, message", [
    ({"EOPIPE_RESYNC_SECONDS": "soon"}, "EOPIPE_RESYNC_SECONDS='soon': not a number"),
    ({"EOPIPE_DELETE_ATTEMPTS": "1.5"}, "EOPIPE_DELETE_ATTEMPTS='1.5': not an integer"),
    ({"EOPIPE_LEADER_ELECTION": "maybe"}, "EOPIPE_LEADER_ELECTION='maybe': not true or false"),
])
def test_a_value_that_does_not_parse_names_its_variable(env, message):
    with pytest.raises(ValueError) as e:
        Settings.from_env(env)
    assert str(e.value) == message


@pytest.mark.parametrize("env, message", [
    ({"EOPIPE_RESYNC_SECONDS": "0"}, "EOPIPE_RESYNC_SECONDS must be above 0"),
    ({"EOPIPE_KAFKA_TIMEOUT_SECONDS": "0"}, "EOPIPE_KAFKA_TIMEOUT_SECONDS must be above 0"),
    ({"EOPIPE_NODE_LOST_SECONDS": "-1"}, "EOPIPE_NODE_LOST_SECONDS must be 0 (never act) or above"),
    ({"EOPIPE_LEADER_ELECTION": "true"}, "set POD_NAMESPACE"),
    ({"EOPIPE_LEADER_ELECTION": "true", "POD_NAMESPACE": "ops", "EOPIPE_RENEW_DEADLINE_SECONDS": "15"},
     "< EOPIPE_LEASE_DURATION_SECONDS (got 2, 15, 15)"),
    ({"EOPIPE_LEADER_ELECTION": "true", "POD_NAMESPACE": "ops", "EOPIPE_RETRY_PERIOD_SECONDS": "0"},
     "0 < EOPIPE_RETRY_PERIOD_SECONDS"),
])
def test_a_configuration_that_cannot_work_is_one_clear_error(env, message):
    with pytest.raises(ValueError) as e:
        Settings.from_env(env).check()
    assert message in str(e.value)


def test_the_defaults_pass_the_check_with_and_without_election():
    Settings().check()
    Settings.from_env({"EOPIPE_LEADER_ELECTION": "1", "POD_NAMESPACE": "ops"}).check()
    assert Settings().resync_seconds == 60 and Settings().leader_election is False
