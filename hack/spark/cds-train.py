"""The training run of the Spark image's class data sharing archive (hack/spark/entrypoint.sh
cds-dump, at image build): a local driver that loads what spark_app's drivers and executors
load at start: the Kafka source, JSON parsing, SQL, a stateful streaming query on the RocksDB
state store through foreachBatch. Nothing leaves the machine: the Kafka source is resolved,
never started; the stream is three files of JSON lines, read as Kafka values are (a string
column), one a micro-batch, until the query ends by itself (availableNow)."""

import json
import os
import sys
import tempfile

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def main() -> int:
    spark = (SparkSession.builder.master("local[2]").appName("eopipe-cds-train")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
             .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
             .config("spark.sql.adaptive.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    kafka = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
             .option("subscribe", "cds-train").load())
    assert "value" in kafka.columns
    seen = []
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in")
        os.mkdir(src)
        for f in range(3):
            with open(os.path.join(src, f"{f}.json"), "w") as out:
                out.writelines(json.dumps({"id": str(i % 50), "amount": i}) + "\n" for i in range(1000))
        records = (spark.readStream.option("maxFilesPerTrigger", 1).text(src)
                   .select(F.from_json("value", "id STRING, amount BIGINT").alias("r")).select("r.*"))
        records.createOrReplaceTempView("payments")
        totals = spark.sql("SELECT id, count(*) AS n, sum(amount) AS amount FROM payments GROUP BY id")
        (totals.writeStream.outputMode("update").option("checkpointLocation", os.path.join(tmp, "checkpoint"))
         .trigger(availableNow=True).foreachBatch(lambda df, batch: seen.append(len(df.collect())))
         .start().awaitTermination())
    spark.stop()
    print(f"cds-train: {len(seen)} micro-batches", file=sys.stderr)
    return 0 if len(seen) >= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
