"""Take a savepoint of a running job now, optionally stopping it (stop-with-savepoint). Trigger it from
the Airflow UI ("Trigger DAG" shows the form) or from the savepoints page."""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_plugin.dag_params import dag_jobs_file, declared_jobs, job_param
from airflow_plugin.operators import SavepointOperator

JOBS_FILE = dag_jobs_file(__file__)
JOBS = declared_jobs(JOBS_FILE)

with DAG(
    dag_id="savepoints_savepoint",
    description=__doc__.splitlines()[0],
    schedule=None,
    catchup=False,
    tags=["savepoints"],
    params={
        "job": job_param(JOBS, JOBS_FILE),
        "stop": Param(False, type="boolean", title="Stop the job afterwards (stop-with-savepoint)"),
        "pin": Param(False, type="boolean", title="Pin (retention never deletes it)"),
        "label": Param(
            None,
            type=["null", "string"],  # optional: the form may be sent without one
            title="Label",
            description="optional key=value stored with the savepoint, e.g. reason=before-migration",
            pattern=r"^$|^[A-Za-z0-9_.\-]+=.*$",
        ),
    },
    render_template_as_native_obj=True,  # stop and pin stay booleans
    doc_md=__doc__,
):
    SavepointOperator(
        task_id="savepoint",
        job="{{ params.job }}",
        stop="{{ params.stop }}",
        pin="{{ params.pin }}",
        labels="{{ params.label }}",  # "key=value" or empty: the operator checks it like the CLI's --label
        trigger="{{ params.get('trigger', 'MANUAL') }}",  # the Savepoints page adds trigger=UI to the conf
        jobs_file=JOBS_FILE,
    )
