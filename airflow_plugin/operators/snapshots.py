"""Take and check snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from ..assets import SNAPSHOTS, emit_snapshot_event, snapshot_xcom
from ..core.jobs.savepoint import take_savepoint
from ..core.jobs.spec import JobSpec
from ..core.snapshots.manifest import Kind, Trigger
from ..core.snapshots.store import SnapshotStore
from ..core.snapshots.verify import verify_snapshot
from ..links import SnapshotLink
from .base import SavepointsBaseOperator, choice, flag


class SavepointOperator(SavepointsBaseOperator):
    """Snapshot the job's running deployment while it keeps running, or stop it first (`stop=True`:
    stop-with-savepoint). Returns the snapshot (id, batch, location, ...) and emits an asset event.

    :param kind: savepoint (user-owned) or checkpoint (retention-managed)
    :param labels: key/value labels stored in the manifest (templated)
    """

    template_fields: Sequence[str] = ("job", "labels", "kind", "stop", "pin", "trigger")
    operator_extra_links = (SnapshotLink(),)

    def __init__(
        self,
        *,
        kind: str = "savepoint",
        stop: bool = False,
        drain: bool = False,
        pin: bool = False,
        labels: dict[str, str] | None = None,
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

    def run(self, job: JobSpec, store: SnapshotStore, context: Context) -> dict[str, Any]:
        manifest = take_savepoint(
            job,
            store,
            kind=choice(Kind, self.kind, "snapshot kind"),
            stop_after=flag(self.stop),
            drain=self.drain,
            pin=flag(self.pin),
            labels={str(k): str(v) for k, v in dict(self.labels).items()},
            trigger=choice(Trigger, self.trigger, "trigger"),
            requested_by=self.requested_by(context),
            timeout=self.timeout_seconds,
            progress=self.progress,
        )
        self.log.info(
            "%s %s of %s at batch %s: %d files, %d bytes (%d uploaded)",
            manifest.kind,
            manifest.id,
            job.name,
            manifest.batch_id,
            len(manifest.files),
            manifest.total_bytes,
            manifest.uploaded_bytes,
        )
        emit_snapshot_event(context, store, manifest)
        return snapshot_xcom(store, manifest)


class VerifySnapshotOperator(SavepointsBaseOperator):
    """Check every stored file of a snapshot against its checksum; `deep` also restores it to scratch and
    reads every operator's state with Spark. Fails the task if anything does not verify."""

    template_fields: Sequence[str] = ("job", "snapshot_id")
    operator_extra_links = (SnapshotLink(),)

    def __init__(self, *, snapshot_id: str = "latest", deep: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.snapshot_id = snapshot_id
        self.deep = deep

    def run(self, job: JobSpec, store: SnapshotStore, context: Context) -> dict[str, Any]:
        report = verify_snapshot(store, job.name, self.snapshot_id, deep=self.deep, progress=self.progress)
        if not report.ok:
            raise AirflowFailException(
                f"snapshot {report.snapshot} of job {job.name} does not verify: {'; '.join(report.problems[:5])}; "
                f"restore another one (`savepoints list --job {job.name}`)"
            )
        return {**snapshot_xcom(store, store.get(job.name, report.snapshot)), "verify": report.to_dict()}
