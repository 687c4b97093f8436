"""Declared jobs kept as the jobs file says, every 5 minutes and as soon as the file changes: each job with `desired`
is deployed, restarted after a failure (within its restart budget), upgraded to its declared version or stopped
(`savepoints apply`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_plugin.assets import jobs_file_changed
from airflow_plugin.compat import AssetOrTimeSchedule, DeltaTriggerTimetable
from airflow_plugin.dag_params import dag_jobs_file, declared_jobs
from airflow_plugin.operators import ApplyJobOperator

JOBS_FILE = dag_jobs_file(__file__)
DECLARED = sorted(name for name, spec in declared_jobs(JOBS_FILE).items() if spec.desired is not None)

with DAG(
    dag_id="savepoints_reconcile",
    description=__doc__.splitlines()[0],
    # the clock, and the file's watcher (a change is acted on within seconds; it needs the triggerer running)
    schedule=AssetOrTimeSchedule(
        timetable=DeltaTriggerTimetable(timedelta(minutes=5)), assets=[jobs_file_changed(JOBS_FILE)]
    ),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # one loop at a time: a second would only be refused by each job's lease
    tags=["savepoints"],
    params={"dry_run": Param(False, type="boolean", title="Dry run: only print each job's step")},
    doc_md=__doc__,
):
    ApplyJobOperator.partial(task_id="apply", jobs_file=JOBS_FILE, dry_run="{{ params.dry_run }}", retries=0).expand(
        job=DECLARED
    )
