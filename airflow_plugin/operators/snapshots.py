"""Take and check snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from .. import stats
from ..assets import SNAPSHOTS, emit_snapshot_event, snapshot_xcom
from ..compat import AirflowFailException
from ..core.jobs.context import JobContext
from ..core.jobs.savepoint import take_savepoint
from ..core.records.manifest import Kind, Trigger, parse_labels
from ..core.snapshots.verify import verify_snapshot
from ..links import SnapshotLink
from .base import SavepointsBaseOperator, choice, flag


class SavepointOperator(SavepointsBaseOperator):
    """Snapshot the job's running deployment while it keeps running, or stop it first (`stop=True`:
    stop-with-savepoint). Returns the snapshot (id, batch, location, ...) and emits an asset event.

    :param kind: savepoint (user-owned) or checkpoint (retention-managed)
    :param labels: labels stored in the manifest: a dict, or one "key=value" text (a DAG form's field; empty
        for none), templated
    """

    template_fields: Sequence[str] = ("job", "labels", "kind", "stop", "pin", "trigger")
    operator_extra_links = (SnapshotLink(),)

    def __init__(
        self,
        *,
        kind: str = "savepoint",
        stop: bool | str = False,
        drain: bool = False,
        pin: bool | str = False,
        labels: dict[str, str] | str | None = None,
        trigger: str = "MANUAL",
        timeout_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", [SNAPSHOTS])
        super().__init__(**kwargs)
        self.kind = kind
        self.stop = stop
        self.drain = drain
        self.pin = pin
        self.labels = labels or {}
        self.trigger = trigger
        self.timeout_seconds = timeout_seconds

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        kind = choice(Kind, self.kind, "snapshot kind")
        with stats.timed(stats.SNAPSHOT, job=ctx.name, kind=str(kind)):
            manifest = take_savepoint(
                ctx,
                kind=kind,
                stop_after=flag(self.stop),
                drain=self.drain,
                pin=flag(self.pin),
                labels=parse_labels(self.labels),
                trigger=choice(Trigger, self.trigger, "trigger"),
                timeout=self.timeout_seconds,
            )
        self.log.info(
            "%s %s of %s at batch %s: %d files, %d bytes (%d uploaded)",
            manifest.kind,
            manifest.id,
            ctx.name,
            manifest.batch_id,
            len(manifest.files),
            manifest.total_bytes,
            manifest.uploaded_bytes,
        )
        emit_snapshot_event(context, ctx.store, manifest)
        return snapshot_xcom(ctx.store, manifest)


class VerifySnapshotOperator(SavepointsBaseOperator):
    """Check every stored file of a snapshot against its checksum; `deep` also restores it to scratch and
    reads every operator's state with Spark. Fails the task if anything does not verify."""

    template_fields: Sequence[str] = ("job", "snapshot_id")
    operator_extra_links = (SnapshotLink(),)

    def __init__(self, *, snapshot_id: str = "latest", deep: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.snapshot_id = snapshot_id
        self.deep = deep

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        report = verify_snapshot(
            ctx.store, ctx.name, self.snapshot_id, deep=self.deep, progress=ctx.progress, spark_conf=ctx.spark_conf()
        )
        if not report.ok:
            raise AirflowFailException(
                f"snapshot {report.snapshot} of job {ctx.name} does not verify: {'; '.join(report.problems[:5])}; "
                f"restore another one (`savepoints list {ctx.name}`)"
            )
        return {**snapshot_xcom(ctx.store, ctx.store.get(ctx.name, report.snapshot)), "verify": report.to_dict()}
