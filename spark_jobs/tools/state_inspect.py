"""A look inside the state, as its own Spark application: Spark's state data sources read every stateful
operator's state at batch N from a checkpoint the engine restored into scratch (core/snapshots/inspect.py;
never a live checkpoint). Writes a JSON result the engine reads.

    spark-submit state_inspect.py inspect --checkpoint DIR --batch N [--key VALUE] [--sample 5] --out result.json
    spark-submit state_inspect.py diff --a DIR --a-batch N --b DIR --b-batch M [--top 10] --out result.json

inspect: per operator and store, the key and value schemas, rows, rows per partition (skew, the largest
partitions), the oldest event-time key when the key has a window, a sample of rows, and with --key the rows of
that key (VALUE matches any field of the key; FIELD=VALUE one field). diff: per operator and store, the keys
added, removed and changed from A to B, the rows and the JSON bytes of the values before and after, and the
keys that grew most (by their numeric value fields where the value has some, else by the JSON bytes of their
values)."""

from __future__ import annotations

import argparse
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, NumericType, StructType, TimestampNTZType, TimestampType

from airflow_plugin.core.snapshots.state_stats import skew
from spark_jobs.tools.app import run_tool
from spark_jobs.tools.state_reader import read_state, state_reads

WINDOW_FIELDS = ("window", "session_window")


def _stores(spark: SparkSession, checkpoint: str) -> list[tuple[Any, str, dict[str, str]]]:
    """(operator metadata row, store label, reader options) for every state instance of the checkpoint."""
    metadata = spark.read.format("state-metadata").load(checkpoint).collect()
    return [(row, label, options) for row in metadata for label, options in state_reads(row)]


def _window_start(key_type: DataType) -> str | None:
    """The key's event-time window start, as a column path (`key.window.start`), when the key has a window."""
    if not isinstance(key_type, StructType):
        return None
    for field in key_type.fields:
        inner = field.dataType
        if field.name in WINDOW_FIELDS and isinstance(inner, StructType):
            start = next((f for f in inner.fields if f.name == "start"), None)
            if start is not None and isinstance(start.dataType, TimestampType | TimestampNTZType):
                return f"key.`{field.name}`.start"
    return None


def _key_match(key_type: DataType, wanted: str) -> Column:
    """Rows whose key has VALUE in any top-level field (or FIELD=VALUE in that field), or whose key as JSON is it."""
    name, sep, value = wanted.partition("=")
    fields = key_type.fields if isinstance(key_type, StructType) else []
    if sep and name in {f.name for f in fields}:
        return F.col(f"key.`{name}`").cast("string") == value
    condition = F.to_json(F.col("key")) == wanted
    for field in fields:
        if not isinstance(field.dataType, StructType):
            condition = condition | (F.col(f"key.`{field.name}`").cast("string") == wanted)
    return condition


def _json_rows(df: DataFrame, limit: int) -> list[dict[str, Any]]:
    rows = df.select(
        F.to_json(F.col("key")).alias("key"), F.to_json(F.col("value")).alias("value"), "partition_id"
    ).limit(limit)
    return [row.asDict() for row in rows.collect()]


def inspect(spark: SparkSession, checkpoint: str, batch: int, key: str | None, sample: int) -> dict[str, Any]:
    result: dict[str, Any] = {"batch_id": batch, "operators": [], "problems": []}
    for row, label, options in _stores(spark, checkpoint):
        entry: dict[str, Any] = {"operator": row.operatorId, "name": row.operatorName, "store": label}
        result["operators"].append(entry)
        try:
            df = read_state(spark, checkpoint, batch, options).cache()
            entry["key_schema"] = df.schema["key"].dataType.simpleString()
            entry["value_schema"] = df.schema["value"].dataType.simpleString()
            per_partition = {r.partition_id: r["count"] for r in df.groupBy("partition_id").count().collect()}
            entry["rows"] = sum(per_partition.values())
            entry["partitions"] = row.numPartitions
            entry["rows_per_partition"] = {str(p): n for p, n in sorted(per_partition.items())}
            entry["skew"] = skew({p: per_partition.get(p, 0) for p in range(row.numPartitions)})
            start = _window_start(df.schema["key"].dataType)
            if start is not None:
                oldest = (
                    df.orderBy(F.col(start).asc())
                    .select(F.to_json(F.col("key")).alias("key"), F.col(start).cast("string").alias("start"))
                    .first()
                )
                entry["oldest_window_start"] = oldest["start"] if oldest else None
                entry["oldest_key"] = oldest["key"] if oldest else None
            entry["sample"] = _json_rows(df, sample)
            if key is not None:
                entry["matches"] = _json_rows(df.where(_key_match(df.schema["key"].dataType, key)), 50)
            df.unpersist()
        except Exception as exc:
            result["problems"].append(
                f"operator {row.operatorId} store {label}: state at batch {batch} unreadable: "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            )
    return result


def _numeric_leaves(data_type: DataType, path: str = "value") -> list[str]:
    if isinstance(data_type, NumericType):
        return [path]
    if isinstance(data_type, StructType):
        return [leaf for f in data_type.fields for leaf in _numeric_leaves(f.dataType, f"{path}.`{f.name}`")]
    return []


def _by_key(df: DataFrame, leaves: list[str]) -> DataFrame:
    """One row per key (as JSON): its rows, the JSON bytes of its values, their values, the sum of numeric leaves."""
    numbers = [F.coalesce(F.col(leaf).cast("double"), F.lit(0.0)) for leaf in leaves]
    total = sum(numbers[1:], numbers[0]) if numbers else F.lit(0.0)
    return (
        df.select(F.to_json(F.col("key")).alias("k"), F.to_json(F.col("value")).alias("v"), total.alias("n"))
        .groupBy("k")
        .agg(
            F.count("*").alias("rows"),
            F.sum(F.length("v")).alias("bytes"),
            F.sort_array(F.collect_list("v")).alias("values"),
            F.sum("n").alias("n"),
        )
    )


def diff(spark: SparkSession, a: str, a_batch: int, b: str, b_batch: int, top: int) -> dict[str, Any]:
    result: dict[str, Any] = {"a_batch_id": a_batch, "b_batch_id": b_batch, "operators": [], "problems": []}
    before = {(row.operatorId, label): (row, options) for row, label, options in _stores(spark, a)}
    after = {(row.operatorId, label): (row, options) for row, label, options in _stores(spark, b)}
    for operator, label in sorted(before.keys() | after.keys()):
        row = (after.get((operator, label)) or before[(operator, label)])[0]
        entry: dict[str, Any] = {"operator": operator, "name": row.operatorName, "store": label}
        result["operators"].append(entry)
        if (operator, label) not in before or (operator, label) not in after:
            entry["only_in"] = "b" if (operator, label) in after else "a"
            result["problems"].append(
                f"operator {operator} store {label} is only in snapshot {entry['only_in'].upper()}"
            )
            continue
        try:
            old = read_state(spark, a, a_batch, before[(operator, label)][1])
            new = read_state(spark, b, b_batch, after[(operator, label)][1])
            leaves = _numeric_leaves(new.schema["value"].dataType)
            if leaves != _numeric_leaves(old.schema["value"].dataType):
                leaves = []
            joined = _by_key(old, leaves).alias("a").join(_by_key(new, leaves).alias("b"), "k", "full_outer").cache()
            both = F.col("a.rows").isNotNull() & F.col("b.rows").isNotNull()
            counts = joined.select(
                F.sum(F.when(F.col("a.rows").isNull(), 1).otherwise(0)).alias("added"),
                F.sum(F.when(F.col("b.rows").isNull(), 1).otherwise(0)).alias("removed"),
                F.sum(F.when(both & (F.col("a.values") != F.col("b.values")), 1).otherwise(0)).alias("changed"),
                F.sum(F.coalesce(F.col("a.rows"), F.lit(0))).alias("rows_a"),
                F.sum(F.coalesce(F.col("b.rows"), F.lit(0))).alias("rows_b"),
                F.sum(F.coalesce(F.col("a.bytes"), F.lit(0))).alias("bytes_a"),
                F.sum(F.coalesce(F.col("b.bytes"), F.lit(0))).alias("bytes_b"),
                F.sum(F.when(F.col("a.rows").isNull(), F.col("b.bytes")).otherwise(0)).alias("bytes_added"),
                F.sum(F.when(F.col("b.rows").isNull(), F.col("a.bytes")).otherwise(0)).alias("bytes_removed"),
            ).first()
            entry.update({name: int(counts[name] or 0) for name in counts.asDict()})
            growth = (
                F.coalesce(F.col("b.n"), F.lit(0.0)) - F.coalesce(F.col("a.n"), F.lit(0.0))
                if leaves
                else F.coalesce(F.col("b.bytes"), F.lit(0)) - F.coalesce(F.col("a.bytes"), F.lit(0))
            )
            entry["growth_by"] = "numeric value fields" if leaves else "JSON bytes of the values"
            grown = joined.withColumn("growth", growth).where(F.col("growth") > 0).orderBy(F.col("growth").desc(), "k")
            entry["grew_most"] = [
                {
                    "key": r["k"],
                    "growth": r["growth"],
                    "before": r["a_values"],
                    "after": r["b_values"],
                }
                for r in grown.select(
                    "k", "growth", F.col("a.values").alias("a_values"), F.col("b.values").alias("b_values")
                )
                .limit(top)
                .collect()
            ]
            joined.unpersist()
        except Exception as exc:
            result["problems"].append(
                f"operator {operator} store {label}: state unreadable: {type(exc).__name__}: {str(exc)[:300]}"
            )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("inspect")
    one.add_argument("--checkpoint", required=True)
    one.add_argument("--batch", type=int, required=True)
    one.add_argument("--key")
    one.add_argument("--sample", type=int, default=5)
    one.add_argument("--out", required=True)
    two = commands.add_parser("diff")
    two.add_argument("--a", required=True)
    two.add_argument("--a-batch", type=int, required=True)
    two.add_argument("--b", required=True)
    two.add_argument("--b-batch", type=int, required=True)
    two.add_argument("--top", type=int, default=10)
    two.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.command == "inspect":
        run_tool(
            "savepoints-inspect",
            args.out,
            lambda spark: inspect(spark, args.checkpoint, args.batch, args.key, args.sample),
        )
    else:
        run_tool(
            "savepoints-diff", args.out, lambda spark: diff(spark, args.a, args.a_batch, args.b, args.b_batch, args.top)
        )


if __name__ == "__main__":
    main()
