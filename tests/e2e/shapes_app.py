"""Variants of the example windowed job for test_upgrade_shapes.py, all appending to a Delta table through the gate on
`window_end`: one-minute windows with a watermark delay of their own (`--shape windows --delay "10 minutes"`), session
windows (`--shape sessions`), or no state at all (`--shape rows`: every event as it arrives). Its own arguments
`--shape`, `--delay` and `--tag` (the version written in each row), then the example job's
(spark_jobs/jobs/windowed/common.py)."""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_plugin.core.durations import duration_seconds
from spark_jobs.jobs.windowed.common import WINDOW, apply_job_conf, events, parse_job_args, raw_events, sink
from spark_jobs.runtime import StreamingJob, run


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    parser = argparse.ArgumentParser(prog="shapes_app", allow_abbrev=False)
    parser.add_argument("--shape", choices=["windows", "sessions", "rows"], required=True)
    parser.add_argument("--delay", default="1 minute", help="windows: the watermark delay")
    parser.add_argument("--tag", required=True)
    own, rest = parser.parse_known_args(job_args)
    args = parse_job_args(rest)
    apply_job_conf(spark)
    horizon = None
    if own.shape == "windows":  # events per user and minute; the state reaches back a window and the delay
        stream = raw_events(spark, args).withWatermark("event_time", own.delay)
        counts = stream.groupBy(F.window("event_time", WINDOW), "user").agg(F.count(F.lit(1)).alias("events"))
        window = F.col("window")
        horizon = f"{_seconds(WINDOW) + _seconds(own.delay)} seconds"
    elif own.shape == "sessions":  # events of a user less than 2 minutes apart form a session
        sessions = events(spark, args).groupBy(F.session_window("event_time", "2 minutes"), "user")
        counts, window = sessions.agg(F.count(F.lit(1)).alias("events")), F.col("session_window")
    else:  # every event, as it arrives
        at = F.col("event_time")
        rows = events(spark, args).select("user", at.alias("window_start"), at.alias("window_end"))
        return sink(rows.withColumn("events", F.lit(1)).withColumn("version", F.lit(own.tag)), args)
    rows = counts.select("user", window.start.alias("window_start"), window.end.alias("window_end"), "events")
    return sink(rows.withColumn("version", F.lit(own.tag)), args, state_horizon=horizon)


def _seconds(duration: str) -> int:
    return round(duration_seconds(duration, "--delay"))


if __name__ == "__main__":
    run(build)
