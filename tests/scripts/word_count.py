"""Running word count over a Kafka topic, in the shape of Spark's structured_kafka_wordcount.py example: lines of
words in, a running count per word out, in complete mode into a Delta table. Its arguments are read with argparse,
which refuses any argument it does not know (exit 2), as a script's own parser does.

Usage: word_count.py <bootstrap-servers> <topic> <table-path> <checkpoint-location>
"""

import argparse

from pyspark.sql import SparkSession
from pyspark.sql.functions import explode, split

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="running word count over a Kafka topic")
    parser.add_argument("bootstrap_servers", help="the Kafka broker")
    parser.add_argument("topic", help="the topic of lines of words")
    parser.add_argument("table", help="the Delta table of counts")
    parser.add_argument("checkpoint", help="the query's checkpoint location")
    args = parser.parse_args()

    spark = SparkSession.builder.appName("StructuredKafkaWordCount").getOrCreate()

    lines = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING)")
    )
    words = lines.select(explode(split(lines.value, " ")).alias("word"))
    word_counts = words.groupBy("word").count()

    query = (
        word_counts.writeStream.outputMode("complete")
        .format("delta")
        .option("checkpointLocation", args.checkpoint)
        .start(args.table)
    )
    query.awaitTermination()
    spark.stop()
