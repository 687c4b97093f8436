"""Retention on a schedule, per job: retained checkpoints of running deployments, then prune and garbage
collection by the job's policy in the jobs file."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_plugin.dag_params import dag_jobs_file, declared_jobs
from airflow_plugin.operators import RetentionOperator

JOBS_FILE = dag_jobs_file(__file__)
JOBS = declared_jobs(JOBS_FILE)

with DAG(
    dag_id="savepoints_retention",
    description=__doc__.splitlines()[0],
    schedule=timedelta(minutes=30),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # two prunes at once would only race for the same deletions
    tags=["savepoints"],
    params={"dry_run": Param(False, type="boolean", title="Dry run: only print the plan")},
    doc_md=__doc__,
):
    RetentionOperator.partial(task_id="retention", jobs_file=JOBS_FILE, dry_run="{{ params.dry_run }}").expand(
        job=sorted(JOBS)
    )
