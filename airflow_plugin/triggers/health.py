"""DeploymentHealthTrigger: waits in the triggerer until a deployment is healthy (fresh heartbeat, K new
batches committed), cannot become healthy (failed, stopped, lost), or the deadline passes. The store
reads are blocking boto3/file calls: they run in a worker thread, never in the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ..core.jobs.health import Verdict
from ..hooks.savepoints import SavepointsHook


class DeploymentHealthTrigger(BaseTrigger):
    def __init__(
        self,
        *,
        job: str,
        deployment_id: str,
        min_batches: int,
        deadline: float,  # seconds since the epoch
        poll_interval: float = 5.0,
        aws_conn_id: str | None = SavepointsHook.default_conn_name,
        jobs_file: str | None = None,
    ) -> None:
        super().__init__()
        self.job = job
        self.deployment_id = deployment_id
        self.min_batches = min_batches
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.aws_conn_id = aws_conn_id
        self.jobs_file = jobs_file

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job": self.job,
                "deployment_id": self.deployment_id,
                "min_batches": self.min_batches,
                "deadline": self.deadline,
                "poll_interval": self.poll_interval,
                "aws_conn_id": self.aws_conn_id,
                "jobs_file": self.jobs_file,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = SavepointsHook(aws_conn_id=self.aws_conn_id, spark_conn_id=None, jobs_file=self.jobs_file)
        hook.s3_settings = await hook.async_s3_settings()  # resolved once, asynchronously; the threads reuse it
        while True:
            try:
                health = await asyncio.to_thread(hook.health, self.job, self.deployment_id, self.min_batches)
            except Exception as exc:  # the task fails with the reason instead of the trigger crashing
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if health.verdict is not Verdict.WAITING:
                status = "healthy" if health.verdict is Verdict.HEALTHY else "unhealthy"
                yield TriggerEvent({"status": status, "message": health.reason, "health": health.to_dict()})
                return
            if time.time() >= self.deadline:
                message = f"not healthy before the deadline: {health.reason}"
                yield TriggerEvent({"status": "timeout", "message": message, "health": health.to_dict()})
                return
            await asyncio.sleep(min(self.poll_interval, max(0.0, self.deadline - time.time())))
