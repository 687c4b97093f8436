"""DeploymentHealthSensor: the health gate. Succeeds when the deployment has a fresh heartbeat and has
committed `min_batches` batches since it started or was restored (with `lag_must_fall`, for a job that reads
Kafka, also once its Kafka lag falls: core/jobs/health.py); fails at once (no waiting out the timeout) when
it failed, stopped or got lost. Deferrable: waits in the triggerer, freeing the worker."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue

from ..compat import AirflowFailException, conf
from ..core.jobs.health import Verdict
from ..hooks.savepoints import SavepointsHook
from ..operators.base import SavepointsMixin, flag, task_errors
from ..triggers.health import DeploymentHealthTrigger


class DeploymentHealthSensor(SavepointsMixin, BaseSensorOperator):
    template_fields: Sequence[str] = ("job", "deployment_id", "min_batches", "lag_must_fall")
    ui_color = "#e8f6ea"

    def __init__(
        self,
        *,
        job: str,
        deployment_id: str,
        min_batches: int | str = 3,
        lag_must_fall: bool | str = False,
        aws_conn_id: str | None = SavepointsHook.default_conn_name,
        jobs_file: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = 5.0,
        timeout: float = 600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self._savepoints_args(job, aws_conn_id, None, jobs_file, None)  # reads the store only: no Spark, no Kafka
        self.deployment_id = deployment_id
        self.min_batches = min_batches
        self.lag_must_fall = lag_must_fall
        self.deferrable = deferrable

    def poke(self, context: Context) -> PokeReturnValue:
        with task_errors():
            health = self.hook.health(self.job, self.deployment_id, int(self.min_batches), flag(self.lag_must_fall))
        self.log.info("%s", health.reason)
        if health.verdict is Verdict.UNHEALTHY:
            raise AirflowFailException(f"job {self.job} is unhealthy: {health.reason}")
        return PokeReturnValue(is_done=health.verdict is Verdict.HEALTHY, xcom_value=health.to_dict())

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)  # check once; defer only if not healthy yet
        if first.is_done:
            return first.xcom_value
        self.defer(
            trigger=DeploymentHealthTrigger(
                job=self.job,
                deployment_id=self.deployment_id,
                min_batches=int(self.min_batches),
                lag_must_fall=flag(self.lag_must_fall),
                deadline=time.time() + float(self.timeout),
                poll_interval=float(self.poke_interval),
                aws_conn_id=self.aws_conn_id,
                jobs_file=self.jobs_file,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        if not event or event.get("status") != "healthy":
            message = (event or {}).get("message", "no event from the trigger")
            raise AirflowFailException(f"job {self.job} deployment {self.deployment_id} is not healthy: {message}")
        self.log.info("%s", event["message"])
        return event["health"]
