"""What a store holds, measured by the prune that just ran and kept in one object (layout.USAGE), so that
`savepoints metrics` reads one small object instead of listing every blob and pack on each scrape: stored
bytes and objects (blobs and packs), and the bytes no snapshot references, which garbage collection removes
once their grace period is over (or a snapshot in flight no longer holds it back)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from ..errors import IntegrityError
from ..layout import BLOBS, PACKS, USAGE, is_stored_content
from ..snapshots.store import SnapshotStore
from ..timestamps import utc_now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreUsage:
    store: str
    measured_at: str  # ISO time of the listing
    bytes: int  # every stored content object (blobs/ and packs/)
    objects: int
    unreferenced_bytes: int  # of `bytes`: referenced by no snapshot of any job (awaiting garbage collection)
    unreferenced_objects: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()


def measure(store: SnapshotStore) -> StoreUsage:
    """List the stored contents and compare them with what every job's catalog references (no manifest read)."""
    referenced = {key for entry in store.list() for key in entry.objects}
    objects = [o for o in (*store.storage.list(BLOBS), *store.storage.list(PACKS)) if is_stored_content(o.key)]
    orphans = [o for o in objects if o.key not in referenced]
    return StoreUsage(
        store=store.uri,
        measured_at=utc_now(),
        bytes=sum(o.size for o in objects),
        objects=len(objects),
        unreferenced_bytes=sum(o.size for o in orphans),
        unreferenced_objects=len(orphans),
    )


def record_usage(store: SnapshotStore) -> StoreUsage:
    """Measure the store and keep the figures for the metrics (the prune's last step)."""
    usage = measure(store)
    store.storage.write(USAGE, usage.to_json())
    return usage


def read_usage(store: SnapshotStore) -> StoreUsage | None:
    """The figures the last prune kept; None when no prune has run on this store yet."""
    try:
        raw = store.storage.read(USAGE)
    except FileNotFoundError:
        return None
    try:
        return StoreUsage(**{**json.loads(raw), "store": store.uri})
    except (ValueError, TypeError) as exc:
        raise IntegrityError(
            f"{store.uri}/{USAGE} is corrupt ({exc}): delete it, the next `savepoints prune` writes it again"
        ) from None
