"""The end of an operation of several tasks: a DAG whose tasks keep the job's lease from one to the next
(the upgrade's cutover) releases it here, whatever happened before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from ..core.context import JobContext
from ..core.errors import NotFound
from ..core.lease import break_lease, read_lease
from .base import SavepointsBaseOperator, lease_holder


class ReleaseLeaseOperator(SavepointsBaseOperator):
    """Release the job's lease if this DAG run holds it (never another holder's)."""

    template_fields: Sequence[str] = ("job",)

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        holder = lease_holder(context)
        current = read_lease(ctx.store.storage, ctx.name)
        released = None
        if current is not None and current.holder == holder:
            try:
                released = break_lease(ctx.store.storage, ctx.name, holder=holder)
            except NotFound:  # expired and taken meanwhile, or gone: nothing of ours is left
                released = None
        self.log.info("lease of %s held by %s: %s", ctx.name, holder, "released" if released else "none held")
        return {"job": ctx.name, "holder": holder, "released": released is not None}
