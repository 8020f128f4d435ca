"""Example Python transform hooks (config `transform: "spark_app.examples:<name>"`).

A hook is a function DataFrame -> DataFrame applied after the pipeline's SQL; it runs on the
driver to build the plan, so it may use any DataFrame API (and UDFs, whose module must be
importable on executors: spark_app ships itself to them)."""

from __future__ import annotations


def amount_in_major_units(df):
    """Adds `amount` = amount_cents / 100 (as a decimal string-safe double)."""
    from pyspark.sql import functions as F

    if "amount_cents" not in df.columns:
        return df
    return df.withColumn("amount", F.round(F.col("amount_cents") / F.lit(100.0), 2))
