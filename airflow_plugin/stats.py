"""The operators' own figures, through Airflow's metrics (`[metrics]`: StatsD, Datadog or OpenTelemetry, as the
deployment configures them; nothing is sent unless it does). Names, all with the tag `job`:

    savepoints.snapshot.duration   timer: a savepoint or retained checkpoint task (a stop first, when asked); tag kind
    savepoints.restore.duration    timer: a deploy that restored state, until the job runs
    savepoints.cutover.duration    timer: an upgrade's cutover task (the old version stopped or gated, the new one
                                   taking over)
    savepoints.refused             counter: a task failed without retry, by `reason`: the engine's error class
                                   (Refused, SourceGap, NoState, NotFound, InvalidInput, ...)

Timers are sent only when the work succeeded. With plain StatsD the tags travel only with
`[metrics] statsd_influxdb_enabled = True` (or Datadog's tags, or OpenTelemetry's attributes). The store's own
figures (snapshot ages, lag, state) are Prometheus' to scrape: `/savepoints/metrics` (core/metrics/)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from .compat import Stats

SNAPSHOT = "savepoints.snapshot.duration"
RESTORE = "savepoints.restore.duration"
CUTOVER = "savepoints.cutover.duration"
REFUSED = "savepoints.refused"


def timing(name: str, started: float, **tags: str) -> None:
    """Send the time since `started` (time.monotonic())."""
    Stats.timing(name, timedelta(seconds=time.monotonic() - started), tags=tags)


@contextmanager
def timed(name: str, **tags: str) -> Iterator[None]:
    """Time the block; nothing is sent when it raises."""
    started = time.monotonic()
    yield
    timing(name, started, **tags)


def refused(job: str, reason: str) -> None:
    Stats.incr(REFUSED, tags={"job": job, "reason": reason})
