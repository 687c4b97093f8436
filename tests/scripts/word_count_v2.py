"""Running word count over a Kafka topic, version 2: empty words (two spaces in a row) are no longer counted.

Usage: word_count_v2.py <bootstrap-servers> <topic> <table-path> <checkpoint-location>
"""

import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, explode, split

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
    word_counts = words.groupBy("word").count()

    query = (
        word_counts.writeStream.outputMode("complete")
        .format("delta")
        .option("checkpointLocation", checkpoint)
        .start(table)
    )
    query.awaitTermination()
    spark.stop()
