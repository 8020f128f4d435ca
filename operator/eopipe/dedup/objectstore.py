"""The object store's few S3 calls for dedup snapshots (dedup/backup.py), through boto3: the AWS
SDK's credential chain (env as a Secret gives it, or the pod's identity) and any S3-compatible
endpoint. Every call has timeouts and every read is bounded (docs/security.md)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from eopipe.dedup import snapshot
from eopipe.dedup.snapshot import FileRef, Location, Manifest

CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
MAX_LISTED = 100_000     # keys of one partition's listing at most
CHUNK = 1 << 20


class BackupError(RuntimeError):
    pass


class Bucket:
    """One bucket and prefix of an S3-compatible store."""

    def __init__(self, loc: Location, endpoint: str | None):
        import boto3
        from botocore.config import Config

        self.loc = loc
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        session = boto3.session.Session()
        self.has_credentials = session.get_credentials() is not None
        self.s3 = session.client(
            "s3", endpoint_url=endpoint or None, region_name=region,
            config=Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                          retries={"max_attempts": 3, "mode": "standard"},
                          # S3-compatible stores: path-style URLs, checksums only where S3 requires them.
                          s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"))

    def put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as f:
            self.s3.put_object(Bucket=self.loc.bucket, Key=key, Body=f)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.loc.bucket, Key=key, Body=data)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError
        try:
            self.s3.head_object(Bucket=self.loc.bucket, Key=key)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def get_bounded(self, key: str, limit: int) -> bytes:
        r = self.s3.get_object(Bucket=self.loc.bucket, Key=key)
        body = r["Body"]
        try:
            if int(r.get("ContentLength", limit + 1)) > limit:
                raise BackupError(f"{key}: larger than {limit} bytes")
            data = body.read(limit + 1)
        finally:
            body.close()
        if len(data) > limit:
            raise BackupError(f"{key}: larger than {limit} bytes")
        return data

    def download(self, key: str, dest: Path, ref: FileRef) -> None:
        """The file, checked against its size and sha256 as the manifest names them."""
        r = self.s3.get_object(Bucket=self.loc.bucket, Key=key)
        h, n, body = hashlib.sha256(), 0, r["Body"]
        try:
            if int(r.get("ContentLength", -1)) != ref.size:
                raise BackupError(f"{key}: {r.get('ContentLength')} bytes, the manifest says {ref.size}")
            with open(dest, "wb") as out:
                for chunk in body.iter_chunks(CHUNK):
                    n += len(chunk)
                    if n > ref.size:
                        raise BackupError(f"{key}: more than {ref.size} bytes")
                    h.update(chunk)
                    out.write(chunk)
        finally:
            body.close()
        if n != ref.size or h.hexdigest() != ref.sha256:
            raise BackupError(f"{key}: {n} bytes, sha256 {h.hexdigest()}: not the file the manifest names")

    def list(self, prefix: str) -> list[tuple[str, float]]:
        """(key, age in seconds) under `prefix`, at most MAX_LISTED."""
        out: list[tuple[str, float]] = []
        now = time.time()
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.loc.bucket, Prefix=prefix)
        for page in pages:
            for o in page.get("Contents", ()):
                out.append((o["Key"], now - o["LastModified"].timestamp()))
                if len(out) >= MAX_LISTED:
                    raise BackupError(f"more than {MAX_LISTED} objects under {prefix}")
        return out

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            self.s3.delete_objects(Bucket=self.loc.bucket,
                                   Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})

    # -- snapshots ------------------------------------------------------------------------
    def manifests(self, p: int) -> list[str]:
        return [k for k, _ in self.list(self.loc.partition(p) + "m-") if snapshot.manifest_created(k) is not None]

    def manifest(self, key: str, p: int) -> Manifest:
        return snapshot.parse_manifest(self.get_bounded(key, snapshot.MAX_MANIFEST_BYTES), p)
