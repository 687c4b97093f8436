"""The jobs file's watcher: a change to the file (a version bumped, a job declared or told to stop) is an event
of the `savepoints-jobs-file` asset, on which the reconcile DAG is scheduled besides its clock, so `savepoints
apply` runs at once instead of at its next scheduled run.

The file's fingerprint is kept where Airflow keeps an asset watcher's state (the asset state store, Airflow
3.3+): a change made while no triggerer ran fires when one comes back, and a restarted triggerer does not fire
again for a change it reported. The event is handed over before the fingerprint is kept, so a triggerer killed
in between fires once more (one more `apply`, which finds nothing to do) rather than never. Airflow 3.1 has no
such store: the fingerprint lives in the trigger, and a change made while no triggerer ran waits for the clock."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

FINGERPRINT = "jobs_file_sha256"  # the asset state store's key


def fingerprint(path: str) -> str | None:
    """The file's SHA-256; None while it is missing (being replaced: a missing file is no change to act on)."""
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except FileNotFoundError:
        return None


class JobsFileChangedTrigger(BaseEventTrigger):
    """Fires an event each time the jobs file's content differs from what it last saw (not on its first look)."""

    def __init__(self, jobs_file: str, poll_interval: float = 5.0) -> None:
        super().__init__()
        self.jobs_file = jobs_file
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath = f"{type(self).__module__}.{type(self).__qualname__}"
        return classpath, {"jobs_file": self.jobs_file, "poll_interval": self.poll_interval}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        seen = await self._kept()
        while True:
            now = await asyncio.to_thread(fingerprint, self.jobs_file)
            if now is not None and now != seen:
                if seen is not None:
                    self.log.info("%s changed (sha256 %s): the reconcile DAG runs", self.jobs_file, now[:12])
                    yield TriggerEvent({"jobs_file": self.jobs_file, "sha256": now})
                else:
                    self.log.info("watching %s (sha256 %s)", self.jobs_file, now[:12])
                seen = now
                await self._keep(now)
            await asyncio.sleep(self.poll_interval)

    async def _kept(self) -> str | None:
        store = getattr(self, "asset_state_store", None)  # the triggerer's, on Airflow 3.3+
        value = await store.aget(FINGERPRINT, default=None) if store is not None else None
        return str(value) if value else None

    async def _keep(self, value: str) -> None:
        store = getattr(self, "asset_state_store", None)
        if store is not None:
            await store.aset(FINGERPRINT, value)
