"""Upgrade a running job to another version without losing or repeating a record, or roll back. The upgrade is
a record in the store (core/upgrades) that these tasks advance, step by step, as `savepoints upgrade` does:

    begin      a live savepoint; the pre-flight of the new version on a throwaway copy, which also decides
               the mode (the form's `mode`, or with `auto` its choice: blue_green where both versions can write through
               the gate, else stop_restore; when the new version cannot take over the old state: migrate where the
               version declares a migration function, else replay); migrate: the migration, checked on a throwaway run
    [approve]  a person approves (optional)
    launch     blue_green: the new version (green) starts beside the old one from the savepoint, staging its
               output; replay: green starts with empty state from earlier Kafka positions; migrate: green starts at
               the savepoint's positions with the migrated state; stop_restore: its driver is pre-started with the
               savepoint restored
    catch_up   green catches up (new batches, a falling Kafka lag, its event time up with the old version's)
    cutover    a window boundary T; the old version writes the windows up to T, green publishes what it staged
               after T and writes from there: no gap, every window once.
               stop_restore: the old version stops with a savepoint, the new one starts from it
    retire     the old version writes its last windows up to T, then stops with a savepoint
    confirm    the health gate after the cutover
    recover    on any failure: before the cutover an abort (the old version never stopped: the new one and
               what it staged removed), after it a rollback (the old version back from a savepoint, the sink
               rewound)

A blocked pre-flight fails the run before anything is started: the old version keeps running."""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_plugin.dag_params import dag_jobs_file, declared_jobs, job_param, version_param
from airflow_plugin.task_groups import upgrade_task_group

JOBS_FILE = dag_jobs_file(__file__)
JOBS = declared_jobs(JOBS_FILE)

with DAG(
    dag_id="savepoints_upgrade",
    description="Upgrade a running job to another version (blue/green, stop/restore, replay, migrate), with rollback",
    schedule=None,
    catchup=False,
    tags=["savepoints"],
    params={
        "job": job_param(JOBS, JOBS_FILE),
        "version": version_param(JOBS, "New version", default=False),
        "mode": Param(
            "auto",
            type="string",
            enum=["auto", "blue_green", "stop_restore", "replay", "migrate"],
            title="Mode",
            description="blue_green: the new version beside the old one, an exactly-once cutover without a gap; "
            "stop_restore: stop with a savepoint, start from it; replay: the new version rebuilds its state from "
            "earlier Kafka records beside the old one; migrate: the version's migration function turns the old state "
            "into the new one's; auto: the pre-flight's choice (blue_green where it applies; when the state cannot "
            "be taken over, migrate or replay)",
            values_display={
                "auto": "the pre-flight's choice",
                "blue_green": "blue/green",
                "stop_restore": "stop/restore",
                "replay": "replay (rebuild the state)",
                "migrate": "migrate (the version's migration function)",
            },
        ),
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
    upgrade_task_group(
        job="{{ params.job }}",
        version="{{ params.version }}",
        mode="{{ params.mode }}",
        require_approval="{{ params.require_approval }}",
        min_batches="{{ params.min_batches }}",
        lag_must_fall="{{ params.kafka_lag_must_fall }}",
        allow_renames="{{ params.allow_renames }}",
        accept_source_gap="{{ params.accept_source_gap }}",
        jobs_file=JOBS_FILE,
        prefix_group_id=False,  # the tasks as the grid names them: begin, launch, catch_up, ...
    )
