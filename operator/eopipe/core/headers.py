"""Record headers the dedup stage writes: a contract between the worker and whoever reads its
topics (the dead-letter topic's readers, `eopipe verify`)."""

# On a dead-lettered record: why, and where it was read.
H_REASON = "eopipe.dlq.reason"
H_TOPIC = "eopipe.origin.topic"
H_PARTITION = "eopipe.origin.partition"
H_OFFSET = "eopipe.origin.offset"
# On a record's copy that the worker wrote to its home partition: "<partition>:<offset>" of
# the record it copied (the copy never reaches the output with it).
H_REROUTED = "eopipe.rerouted.from"
