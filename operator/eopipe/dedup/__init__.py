"""The dedup worker (`eopipe dedup`): the data plane of an ExactlyOncePipeline.

One process owns a set of source partitions; per partition it runs a read_committed consumer
and a transactional producer, deduplicates against RocksDB state, and commits output,
reroutes, dead letters and input offsets in one Kafka transaction, then writes the batch's
keys and the applied offset to RocksDB in one atomic WriteBatch
(docs/design.md#the-exactly-once-protocol).
"""
