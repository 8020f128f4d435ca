"""The topics of one Spark-stage test: its source (the pipeline's deduped topic), sink and
compacted commit topic, and spark_app's configuration over them."""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic


class Topics:
    """Source (the 'deduped' topic), sink and commit topics of one test."""

    def __init__(self, bootstrap: str, partitions: int = 3):
        self.bootstrap = bootstrap
        run = uuid.uuid4().hex[:8]
        self.pipeline = f"sp-{run}"
        self.source, self.sink, self.commits = f"sp-{run}.deduped", f"sp-{run}-out", f"sp-{run}.commits"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futs = admin.create_topics([NewTopic(self.source, partitions, 1), NewTopic(self.sink, partitions, 1),
                                    NewTopic(self.commits, 1, 1, config={"cleanup.policy": "compact"})])
        for f in futs.values():
            f.result(30)

    def config(self, tmp_path: Path, **over) -> dict:
        doc = {"pipeline": self.pipeline, "namespace": "test", "bootstrap": self.bootstrap,
               "source_topic": self.source, "trigger": "1s",
               "checkpoint_location": str(tmp_path / "checkpoint"),
               "sink": {"kind": "kafka", "topic": self.sink, "commit_topic": self.commits}}
        doc.update(over)
        return doc
