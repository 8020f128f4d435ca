pytest_plugins = [
    "tests.localenv.fixtures_kafka",
    "tests.localenv.fixtures_k8s",
    "tests.localenv.fixtures_agent",
    "tests.localenv.fixtures_operator",
    "tests.localenv.fixtures_spark",
]
