"""Example job: events per user and event-time minute, in three versions (v1.py, v2.py, v3.py) that
share `common`. Read the final output with `output.read_output`; feed input with spark_jobs.generate."""
