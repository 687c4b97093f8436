"""The scale bench's streaming job (bench/scale_bench.py), as a user writes one: deduplication of events by a long
key, on RocksDB state with changelog checkpointing (the jobs file's conf), into the `noop` sink. The runtime
takes the query over (checkpoint location, trigger), as for any script.

Usage: scale_job.py --input DIR [--tag NAME]

Each input file is a CSV of chunks, `seed,first,count`: a batch (one file a trigger) turns each chunk into `count`
events whose key is 1 KiB of hex from SHA-512 of (seed, number): distinct across chunks, incompressible (RocksDB's
LZ4 finds nothing to shorten), and made by the JVM, so that gigabytes of state need few input bytes and no broker.
A chunk fed again makes the same keys, which the deduplication drops: how the bench tells new keys from seen ones.
"""

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

KEY_HASHES = 8  # SHA-512 hex digests of 128 characters each: a 1 KiB key
CHUNKS_SCHEMA = "seed LONG, first LONG, count LONG"

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="deduplicate long keys into a noop sink")
    parser.add_argument("--input", required=True, help="a directory of chunk files")
    parser.add_argument("--tag", default="v1", help="the version (an upgrade's new version differs in it only)")
    args = parser.parse_args()

    spark = SparkSession.builder.appName(f"scale-{args.tag}").getOrCreate()
    chunks = spark.readStream.schema(CHUNKS_SCHEMA).option("maxFilesPerTrigger", 1).csv(args.input)
    # the chunks of a file spread over both cores before their events are made (one file is one task otherwise)
    numbers = chunks.repartition(8).select(
        "seed", F.explode(F.sequence(F.col("first"), F.col("first") + F.col("count") - 1)).alias("n")
    )
    name = F.concat_ws(":", F.col("seed"), F.col("n"))
    key = F.concat(*(F.sha2(F.concat(name, F.lit(f"/{part}")), 512) for part in range(KEY_HASHES)))
    events = numbers.select(key.alias("key"), F.lit(args.tag).alias("version"))
    query = events.dropDuplicates(["key"]).writeStream.format("noop").outputMode("append").start()
    query.awaitTermination()
