"""Defaults both planes rely on, defined once: the operator renders the dedup pods with them
and the worker falls back on them when started by hand (dedup/config.py). (The worker's HTTP
port is a name both planes use: core/names.DEDUP_HTTP_PORT.)"""

from __future__ import annotations

# Where a dedup pod's PersistentVolume is mounted: the worker's RocksDB state directory.
STATE_DIR = "/var/lib/eopipe"
# The dedup window when the spec gives none (spec.dedup.window "24h").
WINDOW_SECONDS = 24 * 3600
# Dedup snapshots (spec.dedup.backup, dedup/backup.py): how often each partition is uploaded,
# and how many snapshots per partition are kept.
BACKUP_INTERVAL_SECONDS = 300
BACKUP_RETENTION = 3
