import pytest

pytest_plugins = [
    "localenv.fixtures_kafka",
    "localenv.fixtures_k8s",
    "localenv.fixtures_agent",
    "localenv.fixtures_operator",
    "localenv.fixtures_spark",
]


@pytest.fixture
def pipe(kafka_bootstrap, tmp_path):
    """A test pipeline's topics on the real broker; its worker processes are killed at the end."""
    from tests.helpers.workers import Pipeline

    p = Pipeline(kafka_bootstrap, tmp_path)
    yield p
    p.stop_all()
