"""UpgradeWaitSensor: one phase of an upgrade that waits for the world (the new version catching up, the old one
writing its last windows, the health gate), for a DAG with one task per phase (airflow_plugin.task_groups). Each look
advances the upgrade once; while the step waits, a deferrable sensor waits in the triggerer (UpgradeTrigger) instead
of holding a worker slot. Succeeds when the upgrade left the phases; fails when it turned to its abort or rollback."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from ..core.lease import DEFAULT_TTL
from ..core.upgrades.record import Phase, Upgrades
from ..hooks.savepoints import DEFAULT_KAFKA_CONN, SavepointsHook
from ..operators.base import DEFAULT_SPARK_CONN, task_errors
from ..operators.upgrade import UpgradeDriver, settled


class UpgradeWaitSensor(UpgradeDriver, BaseOperator):
    template_fields: Sequence[str] = ("job", "upgrade_id")
    ui_color = "#e8f6ea"

    def __init__(
        self,
        *,
        job: str,
        upgrade_id: str,
        phases: Sequence[str],
        aws_conn_id: str | None = SavepointsHook.default_conn_name,
        spark_conn_id: str | None = DEFAULT_SPARK_CONN,
        kafka_conn_id: str | None = DEFAULT_KAFKA_CONN,
        jobs_file: str | None = None,
        keep_lease: bool = False,
        lease_ttl: float = DEFAULT_TTL,
        deferrable: bool = True,  # waits in the triggerer, holding no worker slot
        poll_interval: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._savepoints_args(job, aws_conn_id, spark_conn_id, jobs_file, kafka_conn_id)
        self.keep_lease, self.lease_ttl = keep_lease, lease_ttl
        self.upgrade_id = upgrade_id
        self.phases = frozenset(Phase(p) for p in phases)
        self.deferrable, self.poll_interval = deferrable, poll_interval

    def execute(self, context: Context) -> dict[str, Any]:
        with task_errors(context, self.job):
            ctx = self.job_context(context)
            upgrade = Upgrades(ctx.store.storage).get(ctx.name, self.upgrade_id)
            return settled(self.drive(ctx, context, upgrade, self.phases), context)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        with task_errors(context, self.job):
            ctx, upgrade = self.resumed(context, event)
            return settled(self.drive(ctx, context, upgrade, self.phases), context)
