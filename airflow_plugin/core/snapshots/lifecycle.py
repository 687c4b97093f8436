"""Small state changes of a snapshot: pin, unpin, delete (with the stored objects only it referenced)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..errors import Refused
from ..layout import PACKS, retired_key
from .manifest import Manifest, in_flight
from .store import SnapshotStore


def set_pinned(store: SnapshotStore, job: str, snapshot_id: str, pinned: bool) -> Manifest:
    manifest = store.get(job, snapshot_id)
    manifest.pinned = pinned
    store.put(manifest)
    return manifest


def delete_snapshot(store: SnapshotStore, job: str, snapshot_id: str, *, force: bool = False) -> dict[str, Any]:
    """Delete the manifest first (the snapshot disappears at once), then the stored contents no other
    manifest of any job references. A pinned snapshot is refused unless `force`.

    A snapshot being created may be about to reuse contents only the deleted one referenced: it wrote its
    IN_PROGRESS manifest before it looked at what the store holds, so while any snapshot is in flight the
    contents are left for garbage collection instead of being deleted now."""
    manifest = store.get(job, snapshot_id)
    if manifest.pinned and not force:
        raise Refused(
            f"snapshot {manifest.id} of job {job} is pinned: unpin it first with "
            f"`savepoints unpin --job {job} {manifest.id}`; nothing was deleted"
        )
    store.remove(manifest)
    remaining = store.list()
    still_used = {entry.key for other in remaining for entry in other.files}
    # a pack goes only when no remaining snapshot references any content in it (repack: retention/)
    orphans = sorted({entry.key for entry in manifest.files if entry.key not in still_used})
    now = datetime.now(UTC)
    flying = [m.id for m in remaining if in_flight(m, now)]
    if flying:
        return {
            "snapshot": manifest.id,
            "job": job,
            "deleted_blobs": 0,
            "deferred_blobs": len(orphans),
            "deferred_because": f"snapshots in flight: {', '.join(flying)}",
        }
    store.blobs.delete([*orphans, *(retired_key(k) for k in orphans if k.startswith(PACKS))])
    return {"snapshot": manifest.id, "job": job, "deleted_blobs": len(orphans), "deferred_blobs": 0}
