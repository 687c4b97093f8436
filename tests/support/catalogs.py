"""Snapshots and deployments written without a checkpoint, for tests of the catalogs: manifests with made-up
file lists (no content is stored), and the truth a catalog must match, read from the records themselves."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

from airflow_plugin.core.catalog.snapshots import SnapshotEntry
from airflow_plugin.core.layout import pack_key, snapshots_prefix
from airflow_plugin.core.records.manifest import (
    FileEntry,
    Kind,
    Manifest,
    SnapshotStatus,
    Trigger,
    new_snapshot_id,
)
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import Storage


def manifest(
    job: str,
    *,
    kind: Kind = Kind.SAVEPOINT,
    status: SnapshotStatus = SnapshotStatus.COMPLETED,
    at: datetime | None = None,
    files: int = 3,
    pack: int = 0,
    pinned: bool = False,
    source_offsets: list[str] | None = None,
) -> Manifest:
    """A manifest whose `files` entries point into pack number `pack` (made up: nothing is stored)."""
    at = at or datetime.now(UTC)
    stamp = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    where = pack_key(f"{pack:032x}")
    sha = [hashlib.sha256(f"{job}{pack}{n}".encode()).hexdigest() for n in range(files)]
    entries = [FileEntry(f"state/0/{n}/1.delta", 10, sha[n], 0.0, where, 10 * n) for n in range(files)]
    return Manifest(
        id=new_snapshot_id(kind, at),
        job=job,
        kind=kind,
        trigger=Trigger.MANUAL,
        status=status,
        source=f"/checkpoints/{job}",
        created_at=stamp,
        completed_at=stamp if status is not SnapshotStatus.IN_PROGRESS else None,
        batch_id=3,
        files=entries,
        total_bytes=10 * files,
        pinned=pinned,
        source_offsets=source_offsets or ["0"],
    )


def history(job: str, count: int, start: datetime | None = None) -> list[Manifest]:
    """`count` COMPLETED manifests an hour apart, ending now (or `start` + count hours)."""
    first = start or datetime.now(UTC) - timedelta(hours=count)
    return [manifest(job, at=first + timedelta(hours=n), pack=n) for n in range(count)]


def write_unmarked(storage: Storage, made: Manifest) -> None:
    """A manifest written as savepoints did before catalogs: straight to its key, no catalog touched."""
    storage.write(f"{snapshots_prefix(made.job)}{made.id}/manifest.json", made.to_json())


def truth(store: SnapshotStore, job: str) -> dict[str, tuple[str, bool, str | None]]:
    """What the manifests of `job` hold, read one by one: id -> (status, pinned, version)."""
    found = {}
    for info in store.storage.list(snapshots_prefix(job)):
        raw, version = store.storage.read_with_token(info.key)
        data = json.loads(raw)
        found[data["id"]] = (data["status"], data["pinned"], version)
    return found


def listed(entries: list[SnapshotEntry]) -> dict[str, tuple[str, bool, str | None]]:
    """The same, as a catalog lists it."""
    return {e.id: (str(e.status), e.pinned, e.version) for e in entries}
