"""The end of an operation of several tasks: a DAG whose tasks keep the job's lease from one to the next
(an operator with `keep_lease`) releases it here, whatever happened before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from ..core.jobs.context import JobContext
from ..core.lease import release_lease
from .base import SavepointsBaseOperator, lease_holder


class ReleaseLeaseOperator(SavepointsBaseOperator):
    """Release the job's lease if this DAG run holds it (never another holder's)."""

    template_fields: Sequence[str] = ("job",)

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        holder = lease_holder(context)
        released = release_lease(ctx.store.storage, ctx.name, holder)
        self.log.info("lease of %s held by %s: %s", ctx.name, holder, "released" if released else "none held")
        return {"job": ctx.name, "holder": holder, "released": released is not None}
