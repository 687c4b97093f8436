"""Running word count over a Kafka topic, in the shape of Spark's structured_kafka_wordcount.py example:
lines of words in, a running count per word out, in complete mode into a Delta table.

Usage: word_count.py <bootstrap-servers> <topic> <table-path> <checkpoint-location>
"""

import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import explode, split

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
    words = lines.select(explode(split(lines.value, " ")).alias("word"))
    word_counts = words.groupBy("word").count()

    query = (
        word_counts.writeStream.outputMode("complete")
        .format("delta")
        .option("checkpointLocation", checkpoint)
        .start(table)
    )
    query.awaitTermination()
    spark.stop()
