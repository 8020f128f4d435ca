pytest_plugins = [
    "tests.localenv.fixtures_kafka",
]
