"""One operation at a time on a job: what changes a job (deploy, stop, kill, restore, prune, an upgrade's steps,
the reconcile loop's) holds the job's lease (core/lease.py) while it does. A second operation on the same job,
from anyone else, is refused at once (exit 4) naming the holder.

Operations nested in one (a rollback's stop and deploy, an upgrade step's launch) run under the outermost one's
lease instead of asking for it again: what this thread holds is kept here, per store and job, so that a job's
context stays settings and clients."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..lease import Lease, acquire, default_holder
from ..records.deployment import Deployment
from .context import JobContext

_held = threading.local()  # .leases: {(store uri, job): the lease an operation of this thread holds}


@contextmanager
def operation(ctx: JobContext, name: str) -> Iterator[list[Deployment] | None]:
    """Hold the job's lease while operation `name` changes it. Yields the job's deployments as the operation found
    them on taking the lease (what it decides on, read once); None in a nested one (the outer one may have
    changed them since: read them)."""
    leases: dict[tuple[str, str], Lease] = _held.__dict__.setdefault("leases", {})
    key = (ctx.store.uri, ctx.name)
    if key in leases:
        leases[key].check()
        yield None
        return
    holder = ctx.settings.holder or default_holder()
    lease = acquire(ctx.store.storage, ctx.name, holder, name, ctx.settings.lease_ttl)
    leases[key] = lease
    try:
        with lease:
            yield ctx.deployments.list(ctx.name)
            if ctx.settings.keep_lease:
                lease.keep()
    finally:
        del leases[key]
