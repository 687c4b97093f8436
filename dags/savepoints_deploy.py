"""Deploy a version of a job (from its latest state by default; from the latest savepoint, a snapshot id, or fresh)
and wait until it is healthy. A fresh start of a job with state is asked for by name (restore `none`), and its task
log says which state, at which batch, is not carried over."""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_plugin.dag_params import dag_jobs_file, declared_jobs, job_param, restore_param, version_param
from airflow_plugin.operators import DeployJobOperator
from airflow_plugin.sensors import DeploymentHealthSensor

JOBS_FILE = dag_jobs_file(__file__)
JOBS = declared_jobs(JOBS_FILE)

with DAG(
    dag_id="savepoints_deploy",
    description=__doc__.splitlines()[0],
    schedule=None,
    catchup=False,
    tags=["savepoints"],
    params={
        "job": job_param(JOBS, JOBS_FILE),
        "version": version_param(JOBS),
        "restore": restore_param(),
        "rewind_sink": Param(
            False,
            type="boolean",
            title="Rewind the sink",
            description="if the file sink committed batches after the snapshot, move that output into the sink's "
            "_savepoints_quarantine/ and write it again (otherwise the deploy is refused: records would be lost)",
        ),
        "accept_source_gap": Param(
            False,
            type="boolean",
            title="Accept a Kafka source gap",
            description="restore even if Kafka no longer holds every record after the snapshot (the gap is "
            "recorded with the deployment and the snapshot); otherwise the deploy is refused",
        ),
        "min_batches": Param(2, type="integer", minimum=1, title="Healthy after this many new batches"),
    },
    doc_md=__doc__,
):
    deploy = DeployJobOperator(
        task_id="deploy",
        job="{{ params.job }}",
        version="{{ params.version }}",
        restore="{{ params.restore }}",
        rewind_sink="{{ params.rewind_sink }}",
        accept_source_gap="{{ params.accept_source_gap }}",
        jobs_file=JOBS_FILE,
    )
    healthy = DeploymentHealthSensor(
        task_id="healthy",
        job="{{ params.job }}",
        deployment_id="{{ ti.xcom_pull(task_ids='deploy')['deployment'] }}",
        min_batches="{{ params.min_batches }}",
        jobs_file=JOBS_FILE,
        deferrable=True,
        poke_interval=2,
        timeout=600,
    )
    deploy >> healthy
