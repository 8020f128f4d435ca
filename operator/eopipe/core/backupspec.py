"""spec.dedup.backup: where the dedup pods keep snapshots of their state (docs/design.md#snapshots).

The URI's rules are the worker's (dedup/snapshot.parse_uri reads the same pattern), so a manifest
the API server accepts never makes a worker exit on its arguments."""

from __future__ import annotations

from pydantic import Field, field_validator

from eopipe.core.defaults import BACKUP_INTERVAL_SECONDS, BACKUP_RETENTION
from eopipe.core.durations import format_duration, parse_duration
from eopipe.core.specbase import Duration, Model, SecretKeyRef

# s3://bucket[/prefix]: an S3 bucket name, then path segments that start with a letter or digit
# (so never empty, "." or "..").
BUCKET_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
BACKUP_URI_PATTERN = rf"^s3://{BUCKET_PATTERN}(/[A-Za-z0-9][A-Za-z0-9!_.*'()-]*)*/?$"
ENDPOINT_PATTERN = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$"


class ObjectStoreCredentials(Model):
    access_key_id: SecretKeyRef = Field(description="AWS_ACCESS_KEY_ID, from a Secret opened to the pipeline")
    secret_access_key: SecretKeyRef = Field(description="AWS_SECRET_ACCESS_KEY, from a Secret opened to the pipeline")


class Backup(Model):
    uri: str = Field(pattern=BACKUP_URI_PATTERN, max_length=1024,
                     description="s3://bucket/prefix: each dedup pod uploads its partitions' snapshots under it")
    endpoint: str | None = Field(None, pattern=ENDPOINT_PATTERN, max_length=512,
                                 description="an S3-compatible store's endpoint, http(s)://host[:port]; unset: AWS S3 "
                                             "(the tenant policy may restrict it: tenantPolicy.objectStore.endpoints)")
    interval: Duration = Field(format_duration(BACKUP_INTERVAL_SECONDS),
                               description="how often each partition is snapshotted (only files new since the "
                                           "last snapshot are uploaded)")
    retention: int = Field(BACKUP_RETENTION, ge=1, le=100, description="snapshots kept per partition")
    credentials: ObjectStoreCredentials | None = Field(
        None, description="unset: the pod's own (e.g. a ServiceAccount's workload identity)")

    @field_validator("interval")
    @classmethod
    def _at_least_a_second(cls, v: str):
        if parse_duration(v).total_seconds() < 1:
            raise ValueError("backup.interval must be at least 1s")
        return v
