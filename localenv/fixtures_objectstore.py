"""pytest plugin: a real S3-compatible object store (SeaweedFS, localenv/objectstore.py), started
once per session and only when a test asks for it.

- object_store: the running store (restarted first if an outage test left it stopped); make a
  bucket per test with `object_store.client().create_bucket(name)`, reach it with
  `object_store.endpoint` and `object_store.creds`.
"""

from __future__ import annotations

import pytest

from localenv.objectstore import ObjectStore


@pytest.fixture(scope="session")
def object_store_session(tmp_path_factory, request):
    store = ObjectStore(tmp_path_factory.mktemp("objectstore"))
    store.start()
    yield store
    store.stop()
    if request.session.testsfailed:
        print(f"\nSeaweedFS log kept in {store.process.log}")


@pytest.fixture
def object_store(object_store_session) -> ObjectStore:
    if not object_store_session.running:  # an outage test left it stopped
        object_store_session.start()
    return object_store_session
