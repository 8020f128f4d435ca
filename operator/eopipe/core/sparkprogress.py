"""What the Spark driver says of its streaming query: the document spark_app/progress.py serves
at GET /progress (core.names.SPARK_PROGRESS_PORT), read by the operator into status.processing.

spark_app runs in the Spark image without eopipe installed, so the two sides share the keys,
not an import; tests/unit/test_spark_progress.py checks that what the driver writes parses here.
As with the dedup pods' /status (core/wire.py), the reader is strict and bounded: at most
PROGRESS_MAX_BYTES within PROGRESS_READ_SECONDS, and a driver answering anything else is
reported as unreadable, never raised into the operator.
"""

from __future__ import annotations

import http.client
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from pydantic.alias_generators import to_camel

from eopipe.core.wire import get_capped, json_object

# A document is a few hundred bytes plus one offset per source partition: 64 KiB is thousands.
PROGRESS_MAX_BYTES = 64 << 10
PROGRESS_READ_SECONDS = 2.0
# Bounds a real driver never reaches, so that what it says can always be written into status:
# a time up to the year 9999 (status says it as RFC 3339), counts and offsets Kafka's int64s.
EpochMs = Annotated[int, Field(ge=0, le=253_402_300_799_999)]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
Rate = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class SparkProgress(BaseModel):
    """The latest finished micro-batch of the driver's query (batch fields None before the first)."""
    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True, frozen=True)

    query_id: str | None = None
    run_id: str | None = None
    started_at_ms: EpochMs                        # when this run of the query started
    batch_id: Count | None = None
    batch_time_ms: EpochMs | None = None          # when the batch ended (its start + its duration)
    batch_duration_ms: EpochMs | None = None
    num_input_rows: Count | None = None
    input_rows_per_second: Rate | None = None
    processed_rows_per_second: Rate | None = None
    state_rows: Count | None = None               # summed over the stateful operators
    state_bytes: Count | None = None
    # topic -> partition -> the offset the batch read up to (exclusive), Spark's endOffset.
    end_offsets: dict[str, dict[Count, Count]] = Field(default_factory=dict)
    # Set while the checkpoint's store has not answered the driver's probe (spark_app/progress.py).
    checkpoint_unreachable_since_ms: EpochMs | None = None
    checkpoint_error: str | None = Field(None, max_length=1000)
    # False until the driver's query has started; a driver of an earlier image does not say (True).
    query_running: StrictBool = True


def progress_from_body(body: bytes) -> SparkProgress:
    """ValueError if `body` is not a /progress document (ValidationError is one)."""
    return SparkProgress.model_validate(json_object(body))


def read_progress(url: str, *, limit: int = PROGRESS_MAX_BYTES,
                  within: float = PROGRESS_READ_SECONDS) -> tuple[SparkProgress | None, str | None]:
    """GET url: (the progress, None), or (None, why it could not be read) for an unreachable
    driver, an HTTP error, a body over `limit` or not read `within` seconds, or not a /progress."""
    try:
        return progress_from_body(get_capped(url, within, limit, within)), None
    except (OSError, ValueError, http.client.HTTPException) as e:
        text = str(e).splitlines()[0][:200] if str(e) else ""
        return None, f"{type(e).__name__}: {text}" if text else type(e).__name__
