"""Assets: every completed snapshot is an asset event. DAGs declare one alias (their job is a parameter);
the event names the job's snapshot location as the asset and carries the snapshot in its extra, so a DAG
scheduled on a job's snapshots starts with the id, batch and location in hand. And the jobs file is an asset
whose watcher fires when the file changes (triggers/jobs_file.py): the reconcile DAG is scheduled on it."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias, AssetWatcher, Context

from .core import layout
from .core.records.manifest import Manifest
from .core.snapshots.store import SnapshotStore
from .core.storage import LocalStorage
from .triggers.jobs_file import JobsFileChangedTrigger

SNAPSHOTS = AssetAlias("savepoints-snapshots")
JOBS_FILE = "savepoints-jobs-file"


def jobs_file_changed(jobs_file: str) -> Asset:
    """The jobs file, updated each time its content changes (seen within a few seconds by the triggerer)."""
    watcher = AssetWatcher(name=f"{JOBS_FILE}-changed", trigger=JobsFileChangedTrigger(jobs_file))
    return Asset(name=JOBS_FILE, uri=f"file://{jobs_file}", watchers=[watcher])


def job_snapshots_uri(store: SnapshotStore, job: str) -> str:
    base = store.storage.uri
    if isinstance(store.storage, LocalStorage):
        base = f"file://{base}"
    return f"{base.rstrip('/')}/{layout.snapshots_prefix(job).rstrip('/')}"


def snapshot_location(store: SnapshotStore, manifest: Manifest) -> str:
    return f"{store.uri.rstrip('/')}/{layout.snapshot_prefix(manifest.job, manifest.id).rstrip('/')}"


def snapshot_xcom(store: SnapshotStore, manifest: Manifest) -> dict[str, Any]:
    """What a task that took a snapshot returns: its summary plus where it lives."""
    return {**manifest.summary(), "location": snapshot_location(store, manifest)}


def emit_snapshot_event(context: Context, store: SnapshotStore, manifest: Manifest) -> None:
    asset = Asset(name=f"savepoints/{manifest.job}", uri=job_snapshots_uri(store, manifest.job))
    extra = {
        "snapshot_id": manifest.id,
        "job": manifest.job,
        "kind": str(manifest.kind),
        "batch_id": manifest.batch_id,
        "location": snapshot_location(store, manifest),
    }
    context["outlet_events"][SNAPSHOTS].add(asset, extra=extra)
