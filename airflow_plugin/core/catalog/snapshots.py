"""A job's snapshot catalog: what listing needs of each manifest, in one object beside the manifests
(layout.py `snapshot_catalog_key`), kept true to them by core/catalog/index.py. An entry holds the manifest's id,
kind, trigger, status, batch, sizes, labels, pin, times, source positions, sinks, deployment and version,
history, verification verdict and error, the state's size, rows and skew per operator, the store objects its
files live in (with their bytes there), and the manifest version it was made from. No file list: `show`,
restore, verify and garbage collection's repacks read the manifest itself, which stays the commit and the truth.

Who reads the catalog: list, latest (show, restore, deploy's latest-savepoint and latest-state), retention
planning and garbage collection's mark (the objects), the savepoints page, a create's choice of earlier
snapshots to reuse contents from."""

from __future__ import annotations

import copy
import logging
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import IntegrityError
from ..layout import manifest_key, snapshot_catalog_key, snapshot_id_of, snapshots_prefix
from ..records.manifest import Kind, Manifest, SnapshotStatus, Trigger, summary_of
from ..sources import SourcePosition, positions
from ..storage import ObjectInfo, Storage
from .index import RecordIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotEntry:
    """A snapshot as its catalog lists it (manifest.py `Listed`). `version`: of the manifest it was made
    from (a storage token: a delete or change conditional on it fails if the manifest changed since)."""

    id: str
    job: str
    kind: Kind
    trigger: Trigger
    status: SnapshotStatus
    source: str
    created_at: str
    requested_by: str = ""
    request_id: str | None = None
    deployment: str | None = None
    job_version: str | None = None
    completed_at: str | None = None
    query_id: str | None = None
    batch_id: int | None = None
    source_offsets: list[str] = field(default_factory=list)
    offsets_version: int = 1
    sinks: list[dict[str, Any]] = field(default_factory=list)
    file_count: int = 0
    total_bytes: int = 0
    uploaded_bytes: int = 0
    pinned: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    verified: bool | None = None
    error: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    state: list[dict[str, Any]] = field(default_factory=list)  # per operator: size, rows, skew (state_stats.py)
    objects: dict[str, int] = field(default_factory=dict)  # store object -> bytes of its contents there
    version: str | None = None

    @classmethod
    def of(cls, manifest: Manifest, version: str | None) -> SnapshotEntry:
        taken = {f.name: copy.deepcopy(getattr(manifest, f.name)) for f in fields(cls) if f.name not in _DERIVED}
        return cls(
            **taken,
            file_count=manifest.file_count,
            verified=manifest.verified,
            objects=manifest.objects(),
            version=version,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["version"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], version: str | None) -> SnapshotEntry:
        known = {f.name for f in fields(cls)}
        entry = {k: v for k, v in data.items() if k in known and k != "version"}
        kinds = {"kind": Kind(entry["kind"]), "trigger": Trigger(entry["trigger"])}
        return cls(**{**entry, **kinds, "status": SnapshotStatus(entry["status"]), "version": version})

    def source_positions(self) -> list[SourcePosition]:
        return positions(self.offsets_version, self.source_offsets, f"snapshot {self.id}")

    def summary(self) -> dict[str, Any]:
        return summary_of(self)


_DERIVED = ("file_count", "verified", "objects", "version")


class ManifestRecords:
    """The manifests of one job, as core/catalog/index.py sees them."""

    what = "snapshot"

    def __init__(self, storage: Storage, job: str) -> None:
        self.storage, self.job = storage, job

    def key(self, record_id: str) -> str:
        return manifest_key(self.job, record_id)

    def listing(self) -> dict[str, ObjectInfo]:
        found = {}
        for info in self.storage.list(snapshots_prefix(self.job)):
            snapshot_id = snapshot_id_of(info.key, self.job)
            if snapshot_id:
                found[snapshot_id] = info
        return found

    def entry(self, record_id: str, raw: bytes, version: str) -> SnapshotEntry | None:
        where = f"{self.storage.uri}/{self.key(record_id)}"
        try:
            manifest = Manifest.from_json(raw, where)
        except IntegrityError as exc:
            log.warning("skipping %s", exc)
            return None
        if (manifest.job, manifest.id) != (self.job, record_id):
            log.warning(
                "skipping %s: it holds snapshot %s of job %s (a copied manifest?): move it to its own key",
                where,
                manifest.id,
                manifest.job,
            )
            return None
        return SnapshotEntry.of(manifest, version)

    def dump(self, entry: SnapshotEntry) -> dict[str, Any]:
        return entry.to_dict()

    def load(self, data: dict[str, Any], version: str) -> SnapshotEntry:
        return SnapshotEntry.from_dict(data, version)


def snapshot_catalog(storage: Storage, job: str) -> RecordIndex[SnapshotEntry]:
    return RecordIndex(storage, snapshot_catalog_key(job), ManifestRecords(storage, job))
