"""Small state changes of a snapshot: pin, unpin, delete (with the contents only it referenced)."""

from __future__ import annotations

from typing import Any

from .errors import Refused
from .manifest import Manifest
from .store import SnapshotStore


def set_pinned(store: SnapshotStore, job: str, snapshot_id: str, pinned: bool) -> Manifest:
    manifest = store.get(job, snapshot_id)
    manifest.pinned = pinned
    store.put(manifest)
    return manifest


def delete_snapshot(store: SnapshotStore, job: str, snapshot_id: str, *, force: bool = False) -> dict[str, Any]:
    """Delete the manifest first (the snapshot disappears at once), then the stored contents no other
    manifest of any job references. A pinned snapshot is refused unless `force`."""
    manifest = store.get(job, snapshot_id)
    if manifest.pinned and not force:
        raise Refused(
            f"snapshot {manifest.id} of job {job} is pinned: unpin it first with "
            f"`savepoints unpin --job {job} {manifest.id}`; nothing was deleted"
        )
    store.remove(manifest)
    still_used = {entry.sha256 for other in store.list() for entry in other.files}
    orphans = sorted({entry.blob for entry in manifest.files if entry.sha256 not in still_used})
    store.storage.delete(orphans)
    return {"snapshot": manifest.id, "job": job, "deleted_blobs": len(orphans)}
