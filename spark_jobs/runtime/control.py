"""The control channel: requests the engine writes to `control/<id>.json` in the store, polled by the
driver. And the graceful stop they ask for: at a batch boundary (docs/spark-checkpoints.md section 8), so the
checkpoint ends with C = L and a stop-with-savepoint copies a quiescent batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import ControlRequest

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

BOUNDARY_POLL = 0.01  # seconds: a trigger that ends is seen within this
MIN_BOUNDARY_WAIT = 1.0  # seconds: the least time given a running batch to finish before a stop interrupts it
MAX_BOUNDARY_WAIT = 30.0  # ... and the most beyond the trigger interval (the engine's stop waits interval + 60 s)
DRAIN_BOUNDARY_WAIT = 5.0  # the same for an available-now (drain) run, which has no interval


def boundary_wait(interval: float | None, last_batch: float) -> float:
    """How long a stop waits for the running batch to end: one trigger interval, or the last batch's
    duration and a half when batches take longer. A query on schedule finishes its batch within the
    interval, so the stop stays within interval + poll + a moment; one whose batches take longer (200 state
    partitions on a small machine) is let finish the batch it is in, rather than have it interrupted and run
    again after the restart (work that would add to an upgrade's downtime). At most MAX_BOUNDARY_WAIT
    beyond the interval."""
    if interval is None:
        return DRAIN_BOUNDARY_WAIT
    interval = max(MIN_BOUNDARY_WAIT, interval)
    return min(max(interval, 1.5 * last_batch), interval + MAX_BOUNDARY_WAIT)


class ControlChannel:
    """Pending requests of one deployment; each id is handed out once (ids handled by an earlier run of
    the same deployment are passed in and skipped)."""

    def __init__(self, deployments: Deployments, job: str, deployment_id: str, handled: Iterable[str] = ()) -> None:
        self._deployments = deployments
        self._job = job
        self._deployment_id = deployment_id
        self._seen: set[str] = set(handled)

    def next_stop(self) -> ControlRequest | None:
        return self.next_request("stop")

    def next_request(self, *actions: str) -> ControlRequest | None:
        """The oldest request with one of `actions` not handed out before, or None. Other actions are
        logged and skipped (a newer engine may know more actions than this runtime, and a start request
        means nothing to a running query); a store hiccup reads as 'nothing'."""
        try:
            requests = self._deployments.requests(self._job, self._deployment_id, skip=self._seen)
        except (SavepointsError, OSError) as exc:
            log.warning("could not read control requests (will retry): %s", exc)
            return None
        for request in requests:
            if request.id in self._seen:
                continue
            self._seen.add(request.id)
            if request.action in actions:
                return request
            log.warning("ignoring control request %s with action %r here", request.id, request.action)
        return None


def stop_at_batch_boundary(query: StreamingQuery, wait_limit: float, batch_done: threading.Event) -> str:
    """Stop `query` between two batches, so that the checkpoint ends with C = L.

    Stops as soon as no trigger runs, or as soon as a batch commits (`batch_done`, set by the progress
    listener): a query that runs behind starts its next trigger at once and leaves no idle gap to find,
    and right after a commit the next batch has barely begun. After `wait_limit` seconds it stops anyway.
    Stopping inside a batch is safe, only slower to resume: Spark interrupts batch L, leaving C = L-1,
    and a restart re-runs L from its logged offsets (docs/spark-checkpoints.md sections 3 and 8).
    Returns where the stop was issued, for the log (the race with the next trigger cannot be closed)."""
    deadline = time.monotonic() + wait_limit
    batch_done.clear()
    where = "after the query ended"
    while query.isActive:
        if not query.status["isTriggerActive"]:
            where = "between batches"
            break
        if batch_done.is_set():
            where = "right after a commit"
            break
        if time.monotonic() >= deadline:
            where = f"inside a batch (no boundary within {wait_limit:.1f} s)"
            break
        time.sleep(BOUNDARY_POLL)  # polling a JVM flag: Spark has no event for "trigger ended"
    query.stop()
    return where
