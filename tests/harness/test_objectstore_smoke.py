"""The object store is the real SeaweedFS S3 gateway: signed S3 calls work with the identity it
was given and fail without it, objects outlive a restart, and a stopped gateway fails clients."""

import uuid

import pytest
import requests

from localenv.objectstore import ObjectStoreError, S3Client, S3Credentials


def test_put_get_survive_a_restart_and_a_stopped_gateway_fails_the_client(object_store):
    s3, bucket = object_store.client(), f"smoke-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    s3.create_bucket(bucket)  # idempotent, as a setup step must be
    s3.put(bucket, "a/b.bin", b"\x00payload\xff")
    assert s3.get(bucket, "a/b.bin") == b"\x00payload\xff"
    assert s3.keys(bucket, "a/") == ["a/b.bin"]
    assert bucket in s3.list_buckets()

    wrong = S3Client(object_store.endpoint, S3Credentials(object_store.creds.access_key, "not-the-secret"))
    with pytest.raises(ObjectStoreError, match="HTTP 403"):
        wrong.get(bucket, "a/b.bin")

    object_store.stop()
    with pytest.raises(requests.ConnectionError):
        s3.get(bucket, "a/b.bin")
    object_store.start()
    assert s3.get(bucket, "a/b.bin") == b"\x00payload\xff"
