"""Assets: every completed snapshot is an asset event. DAGs declare one alias (their job is a parameter);
the event names the job's snapshot location as the asset and carries the snapshot in its extra, so a DAG
scheduled on a job's snapshots starts with the id, batch and location in hand."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias, Context

from .core.snapshots.manifest import Manifest
from .core.snapshots.store import SnapshotStore, manifest_key
from .core.storage import LocalStorage

SNAPSHOTS = AssetAlias("savepoints-snapshots")


def job_snapshots_uri(store: SnapshotStore, job: str) -> str:
    base = store.storage.uri
    if isinstance(store.storage, LocalStorage):
        base = f"file://{base}"
    return f"{base.rstrip('/')}/jobs/{job}/snapshots"


def snapshot_location(store: SnapshotStore, manifest: Manifest) -> str:
    base = store.storage.uri.rstrip("/")
    return f"{base}/{manifest_key(manifest.job, manifest.id).rsplit('/', 1)[0]}"


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
