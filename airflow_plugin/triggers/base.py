"""What every savepoints trigger shares, written once (the amazon provider's AwsBaseWaiterTrigger): its
serialization from declared fields, the hook, and a poll loop that ends with one event: the subclass's
verdict, a timeout at the deadline, or an error with its reason (a trigger never crashes the triggerer).
The store reads are blocking boto3/file calls: `check` runs in a worker thread, never in the event loop."""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ..hooks.savepoints import SavepointsHook


class SavepointsPollTrigger(BaseTrigger):
    """Polls `check(hook)` every `poll_interval` seconds until it returns an event payload or `deadline`
    (seconds since the epoch) passes. Subclasses list their own arguments in `fields`."""

    fields: ClassVar[tuple[str, ...]] = ()
    base_fields: ClassVar[tuple[str, ...]] = ("job", "deadline", "poll_interval", "aws_conn_id", "jobs_file")

    def __init__(
        self,
        *,
        job: str,
        deadline: float,
        poll_interval: float = 5.0,
        aws_conn_id: str | None = SavepointsHook.default_conn_name,
        jobs_file: str | None = None,
    ) -> None:
        super().__init__()
        self.job = job
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.aws_conn_id = aws_conn_id
        self.jobs_file = jobs_file

    def serialize(self) -> tuple[str, dict[str, Any]]:
        names = (*self.base_fields, *self.fields)
        return f"{type(self).__module__}.{type(self).__qualname__}", {name: getattr(self, name) for name in names}

    @abstractmethod
    def check(self, hook: SavepointsHook) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """One look (blocking): the final event's payload, or None to wait on; and what was seen (a payload
        with a "message"), which a timeout reports."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # no Spark and no Kafka connection: a trigger only reads the store (connections resolve async, below)
        hook = SavepointsHook(
            aws_conn_id=self.aws_conn_id, spark_conn_id=None, jobs_file=self.jobs_file, kafka_conn_id=None
        )
        hook.s3_settings = await hook.async_s3_settings()  # resolved once, asynchronously; the threads reuse it
        while True:
            try:
                payload, seen = await asyncio.to_thread(self.check, hook)
            except Exception as exc:  # the task fails with the reason instead of the trigger crashing
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if payload is not None:
                yield TriggerEvent(payload)
                return
            if time.time() >= self.deadline:
                message = f"not done before the deadline: {seen.get('message', '')}"
                yield TriggerEvent({**seen, "status": "timeout", "message": message})
                return
            await asyncio.sleep(min(self.poll_interval, max(0.0, self.deadline - time.time())))
