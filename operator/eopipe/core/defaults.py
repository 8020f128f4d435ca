"""Defaults both planes rely on, defined once: the operator renders the dedup pods with them
and the worker falls back on them when started by hand (dedup/config.py)."""

from __future__ import annotations

# The worker's HTTP port (/healthz, /readyz, /metrics, /status, the state transfer): the pods'
# container port, the headless Service's port and the peers' URLs in the assignment.
HTTP_PORT = 8080
# Where a dedup pod's PersistentVolume is mounted: the worker's RocksDB state directory.
STATE_DIR = "/var/lib/eopipe"
# The dedup window when the spec gives none (spec.dedup.window "24h").
WINDOW_SECONDS = 24 * 3600
