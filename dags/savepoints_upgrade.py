"""Upgrade a running job to another version without losing a record, or roll back:

    savepoint (live) -> pre-flight of the new version on a throwaway copy -> [approval] ->
    pre-start the new version's driver (STANDBY) with the live savepoint restored into its location ->
    stop-with-savepoint of the old version -> restore what changed since into the pre-started driver
    and start it -> health gate (new batches and, for a job that reads Kafka, a falling lag)
    -> on failure: rollback, the old version redeployed from the same savepoint

A blocked pre-flight fails the run before anything is stopped: the old version keeps running. It blocks a
state the new version cannot take, and Kafka offsets whose records are gone or a subscription Spark would
fail on. So does a new version whose driver cannot even start (pre-start fails before the cutover)."""

from __future__ import annotations

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import DAG, Param, TriggerRule, task

from airflow_plugin.compat import AirflowFailException
from airflow_plugin.dag_params import dag_jobs_file, declared_jobs, job_param, version_param
from airflow_plugin.operators import (
    DeployJobOperator,
    PreflightCheckOperator,
    PrestartJobOperator,
    ReleaseLeaseOperator,
    RollbackOperator,
    SavepointOperator,
    StopJobOperator,
)
from airflow_plugin.sensors import DeploymentHealthSensor

JOBS_FILE = dag_jobs_file(__file__)
JOBS = declared_jobs(JOBS_FILE)
CUTOVER_LEASE_SECONDS = 1800.0  # covers stop, restore, start and the health gate; release_lease ends it sooner
STOP_SAVEPOINT = "{{ (ti.xcom_pull(task_ids='stop_old') or {}).get('snapshot', {}).get('id', '') }}"

with DAG(
    dag_id="savepoints_upgrade",
    description="Restore-and-redeploy: upgrade a running job to another version, with pre-flight and rollback",
    schedule=None,
    catchup=False,
    tags=["savepoints"],
    params={
        "job": job_param(JOBS, JOBS_FILE),
        "version": version_param(JOBS, "New version", default=False),
        "allow_renames": Param(
            False, type="boolean", title="Allow state field renames (Spark does not check names: be sure)"
        ),
        "require_approval": Param(False, type="boolean", title="Wait for a human approval before the cutover"),
        "min_batches": Param(3, type="integer", minimum=1, title="Healthy after this many new batches"),
        "kafka_lag_must_fall": Param(
            True,
            type="boolean",
            title="A job reading Kafka is healthy only once its lag falls",
            description="besides the new batches: the Kafka lag of its last batch is 0 or below its first batch's",
        ),
        "accept_source_gap": Param(
            False,
            type="boolean",
            title="Accept a Kafka source gap",
            description="upgrade even if Kafka no longer holds every record after the savepoint (recorded); "
            "otherwise the pre-flight blocks",
        ),
    },
    doc_md=__doc__,
):
    savepoint = SavepointOperator(
        task_id="savepoint",
        job="{{ params.job }}",
        trigger="UPGRADE",
        labels={"upgrade_to": "{{ params.version }}"},
        jobs_file=JOBS_FILE,
    )
    preflight = PreflightCheckOperator(
        task_id="preflight",
        job="{{ params.job }}",
        version="{{ params.version }}",
        snapshot_id="{{ ti.xcom_pull(task_ids='savepoint')['id'] }}",
        allow_renames="{{ params.allow_renames }}",
        accept_source_gap="{{ params.accept_source_gap }}",
        jobs_file=JOBS_FILE,
    )

    @task.branch
    def approval_needed(params: dict) -> str:
        return "approve" if params["require_approval"] else "prestart_new"

    approve = ApprovalOperator(
        task_id="approve",
        subject="Upgrade {{ params.job }} to {{ params.version }}?",
        body="Pre-flight passed: {{ (ti.xcom_pull(task_ids='preflight') or {}).get('reason', '') }}",
    )
    # The cutover holds the job's lease from the pre-start to the end of the run (release_lease): another
    # run, DAG or person acting on the job meanwhile is refused, naming this run.
    cutover = {"keep_lease": True, "lease_ttl": CUTOVER_LEASE_SECONDS, "jobs_file": JOBS_FILE}
    prestart_new = PrestartJobOperator(
        task_id="prestart_new",
        job="{{ params.job }}",
        version="{{ params.version }}",
        prerestore="{{ ti.xcom_pull(task_ids='savepoint')['id'] }}",  # the bulk moves before the stop
        trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
        **cutover,
    )
    stop_old = StopJobOperator(
        task_id="stop_old",
        job="{{ params.job }}",
        savepoint=True,
        labels={"upgrade_to": "{{ params.version }}"},
        **cutover,
    )
    deploy_new = DeployJobOperator(
        task_id="deploy_new",
        job="{{ params.job }}",
        standby_deployment="{{ ti.xcom_pull(task_ids='prestart_new')['deployment'] }}",
        restore=STOP_SAVEPOINT,
        rewind_sink=True,  # a batch the stop interrupted after its sink commit is replayed, not skipped
        accept_source_gap="{{ params.accept_source_gap }}",
        wait_seconds=0,  # start only: the health gate decides, and a failure there rolls back
        **cutover,
    )
    health_gate = DeploymentHealthSensor(
        task_id="health_gate",
        job="{{ params.job }}",
        deployment_id="{{ ti.xcom_pull(task_ids='deploy_new')['deployment'] }}",
        min_batches="{{ params.min_batches }}",
        lag_must_fall="{{ params.kafka_lag_must_fall }}",
        jobs_file=JOBS_FILE,
        deferrable=True,
        poke_interval=2,
        timeout=300,
    )
    rollback = RollbackOperator(
        task_id="rollback",
        job="{{ params.job }}",
        snapshot_id=STOP_SAVEPOINT,
        jobs_file=JOBS_FILE,
        trigger_rule=TriggerRule.ONE_FAILED,
    )

    release_lease = ReleaseLeaseOperator(
        task_id="release_lease", job="{{ params.job }}", jobs_file=JOBS_FILE, trigger_rule=TriggerRule.ALL_DONE
    )

    @task(trigger_rule=TriggerRule.ONE_FAILED)
    def upgrade_failed() -> None:
        """Fails the run whenever a step failed, even when the rollback that followed succeeded."""
        raise AirflowFailException("the upgrade did not go through: see the failed task (and the rollback)")

    branch = approval_needed()
    savepoint >> preflight >> branch >> [approve, prestart_new]
    approve >> prestart_new >> stop_old >> deploy_new >> health_gate
    [prestart_new, stop_old, deploy_new, health_gate] >> rollback >> release_lease
    [savepoint, preflight, prestart_new, stop_old, deploy_new, health_gate, rollback] >> upgrade_failed()
