"""Small state changes of a snapshot: pin, unpin, delete (with the stored objects only it referenced)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..errors import Conflict, Refused
from ..layout import PACKS, retired_key
from ..records.manifest import Manifest, in_flight
from .store import LATEST, SnapshotStore


def set_pinned(store: SnapshotStore, job: str, snapshot_id: str, pinned: bool) -> Manifest:
    target = store.latest_entry(job).id if snapshot_id == LATEST else snapshot_id
    return store.update(job, target, lambda manifest: setattr(manifest, "pinned", pinned))


def delete_snapshot(store: SnapshotStore, job: str, snapshot_id: str, *, force: bool = False) -> dict[str, Any]:
    """Delete the manifest first (the snapshot disappears at once; only the version read here: one pinned
    meanwhile stays), then the stored objects no remaining snapshot of any job references (every catalog
    checked against its manifests first). A pinned snapshot is refused unless `force`.

    A snapshot being created may be about to reuse contents only the deleted one referenced: it wrote its
    IN_PROGRESS manifest before it looked at what the store holds, so while any snapshot is in flight the
    objects are left for garbage collection instead of being deleted now."""
    entry = store.current(job, snapshot_id)
    if entry.pinned and not force:
        raise Refused(
            f"snapshot {entry.id} of job {job} is pinned: unpin it first with "
            f"`savepoints unpin {job} {entry.id}`; nothing was deleted"
        )
    if store.remove([(job, entry.id, entry.version)]):
        raise Conflict(
            f"snapshot {entry.id} of job {job} changed while it was being deleted (pinned, say): nothing was deleted; "
            f"see `savepoints show {job} {entry.id}`"
        )
    remaining = store.validated().entries
    still_used = {key for other in remaining for key in other.objects}
    # a pack goes only when no remaining snapshot references any content in it (repack: retention/)
    orphans = sorted(key for key in entry.objects if key not in still_used)
    now = datetime.now(UTC)
    flying = [other.id for other in remaining if in_flight(other, now)]
    if flying:
        return {
            "snapshot": entry.id,
            "job": job,
            "deleted_blobs": 0,
            "deferred_blobs": len(orphans),
            "deferred_because": f"snapshots in flight: {', '.join(flying)}",
        }
    store.blobs.delete([*orphans, *(retired_key(k) for k in orphans if k.startswith(PACKS))])
    return {"snapshot": entry.id, "job": job, "deleted_blobs": len(orphans), "deferred_blobs": 0}
