"""localenv/sparkcds.py's cache: a new archive leaves the two newest others (other checkouts'
archives) and removes the rest. (That a driver maps the cached archive is
tests/integration/test_spark_app.py's.)"""

import os

from localenv import sparkcds


def test_a_new_archive_keeps_the_two_newest_others(tmp_path, monkeypatch):
    monkeypatch.setattr(sparkcds, "CACHE", tmp_path)
    for i in range(5):
        (tmp_path / f"spark-cds-{i}").mkdir()
        os.utime(tmp_path / f"spark-cds-{i}", (1000 + i, 1000 + i))
    (tmp_path / "kafka-4.3.1").mkdir()
    new = tmp_path / "spark-cds-0"  # the oldest by mtime, but the one just made
    sparkcds._prune(new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kafka-4.3.1", "spark-cds-0", "spark-cds-3", "spark-cds-4"]
