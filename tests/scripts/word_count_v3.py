"""Running word count over a Kafka topic, version 3, a bad release: it adds a column, the word's length, without
letting the Delta table's schema change. The state is v2's (its pre-flight, which plans a batch into a noop sink,
passes), but Delta refuses its first write (a schema mismatch): the new version fails once it runs, its health gate
fails, and the upgrade rolls back.

Usage: word_count_v3.py <bootstrap-servers> <topic> <table-path> <checkpoint-location>
"""

import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, explode, length, split

if __name__ == "__main__":
    bootstrap_servers, topic, table, checkpoint = sys.argv[1:5]

    spark = SparkSession.builder.appName("StructuredKafkaWordCount").getOrCreate()

    lines = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING)")
    )
    words = lines.select(explode(split(lines.value, " ")).alias("word")).where(col("word") != "")
    word_counts = words.groupBy("word").count().withColumn("length", length("word"))

    query = (
        word_counts.writeStream.outputMode("complete")
        .format("delta")
        .option("checkpointLocation", checkpoint)
        .start(table)
    )
    query.awaitTermination()
    spark.stop()
