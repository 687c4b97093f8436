"""`upgrade_task_group`: an upgrade as one task per phase, for a grid that shows each (begin, an optional approval,
launch, catch_up, cutover, retire, confirm, recover), wired without XCom templates in the DAG. The same upgrade in one
task: `airflow_plugin.operators.UpgradeJobOperator`. Both advance the same record in the store (core/upgrades)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import TaskGroup, TriggerRule, task

from .compat import AirflowFailException
from .operators.upgrade import BeginUpgradeOperator, RecoverUpgradeOperator, UpgradeStepOperator
from .sensors.upgrade import UpgradeWaitSensor


def upgrade_task_group(
    *,
    job: str,
    version: str,
    mode: str = "auto",
    require_approval: bool | str = False,
    min_batches: int | str = 3,
    lag_must_fall: bool | str = True,
    allow_renames: bool | str = False,
    accept_source_gap: bool | str = False,
    group_id: str = "upgrade",
    prefix_group_id: bool = True,
    **connections: Any,
) -> TaskGroup:
    """The upgrade's tasks in a task group (`prefix_group_id=False`: task ids without the group's prefix). Values may
    be templates (`"{{ params.job }}"`); `require_approval` asks a person (Airflow's ApprovalOperator) after the
    pre-flight; `connections`: `aws_conn_id`, `spark_conn_id`, `kafka_conn_id`, `jobs_file`, given to every task. A
    failed step is followed by the recovery (its abort or rollback), and the group's last task fails whenever a step
    failed, even when the recovery succeeded."""
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    with TaskGroup(group_id=group_id, prefix_group_id=prefix_group_id) as group:
        ids = _ids(group_id if prefix_group_id else None)
        begin = BeginUpgradeOperator(
            task_id="begin",
            job=job,
            version=version,
            mode=mode,
            min_batches=min_batches,
            lag_must_fall=lag_must_fall,
            allow_renames=allow_renames,
            accept_source_gap=accept_source_gap,
            **connections,
        )
        upgrade_id = (
            f"{{{{ (ti.xcom_pull(task_ids='{ids('begin')}') or ti.xcom_pull(task_ids='{ids('begin')}', key='upgrade')"
            " or {}).get('id', '') }}"
        )

        @task.branch(task_id="approval_needed")
        def approval_needed(needed: object) -> str:
            return ids("approve") if str(needed).strip().lower() in ("true", "1", "yes") else ids("launch")

        begun = f"(ti.xcom_pull(task_ids='{ids('begin')}') or {{}})"
        approve = ApprovalOperator(
            task_id="approve",
            subject=f"Upgrade {job} to {version}?",
            body=f"Pre-flight passed, mode {{{{ {begun}.get('mode', '') }}}}: "
            f"{{{{ ({begun}.get('preflight') or {{}}).get('reason', '') }}}}",
        )
        step = {"job": job, "upgrade_id": upgrade_id, **connections}
        launch = UpgradeStepOperator(
            task_id="launch", phases=["LAUNCHING"], trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS, **step
        )
        wait = {**step, "poll_interval": 2.0}  # a look every 2 s, in the triggerer: the cutover waits on the catch-up
        catch_up = UpgradeWaitSensor(task_id="catch_up", phases=["CATCHING_UP"], **wait)
        cutover = UpgradeStepOperator(task_id="cutover", phases=["CUTTING_OVER"], **step)
        retire = UpgradeWaitSensor(task_id="retire", phases=["RETIRING"], **wait)
        confirm = UpgradeWaitSensor(task_id="confirm", phases=["CONFIRMING"], **wait)
        recover = RecoverUpgradeOperator(task_id="recover", trigger_rule=TriggerRule.ONE_FAILED, **step)

        @task(task_id="upgrade_failed", trigger_rule=TriggerRule.ONE_FAILED)
        def upgrade_failed() -> None:
            """Fails the run whenever a step failed, even when the abort or rollback that followed succeeded."""
            raise AirflowFailException("the upgrade did not go through: see the failed task and the recovery")

        branch = approval_needed(require_approval)
        begin >> branch >> [approve, launch]
        approve >> launch >> catch_up >> cutover >> retire >> confirm
        [launch, catch_up, cutover, retire, confirm] >> recover
        [begin, launch, catch_up, cutover, retire, confirm, recover] >> upgrade_failed()
    return group


def _ids(prefix: str | None) -> Any:
    return lambda task_id: f"{prefix}.{task_id}" if prefix else task_id
