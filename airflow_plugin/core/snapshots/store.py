"""The snapshots of a store: manifests per job (their keys: layout.py), read, listed, written, removed; the
contents they reference are behind `SnapshotStore.blobs` (blobs.py)."""

from __future__ import annotations

import logging

from .. import layout
from ..errors import IntegrityError, NotFound
from ..layout import check_name, manifest_key
from ..parallel import run_parallel
from ..storage import Storage
from .blobs import Blobs
from .manifest import Manifest, SnapshotStatus

log = logging.getLogger(__name__)

LATEST = "latest"


class SnapshotStore:
    """Manifests of one store, and its stored contents (`blobs`). Listing skips unreadable manifests with a
    warning; `get` raises."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.blobs = Blobs(storage)

    @property
    def uri(self) -> str:
        return self.storage.uri

    def jobs(self) -> list[str]:
        return sorted({job for info in self.storage.list(layout.JOBS) if (job := layout.job_of(info.key))})

    def _manifest_keys(self, job: str | None) -> list[str]:
        return [info.key for info in self.storage.list(layout.snapshots_prefix(job)) if layout.is_manifest(info.key)]

    def list(self, job: str | None = None) -> list[Manifest]:
        """All readable manifests (of one job), oldest first."""

        def load(key: str) -> Manifest | None:
            try:
                return Manifest.from_json(self.storage.read(key), f"{self.uri}/{key}")
            except FileNotFoundError:
                return None  # deleted while we listed
            except IntegrityError as exc:
                log.warning("skipping %s", exc)
                return None

        manifests = [m for m in run_parallel(load, self._manifest_keys(job)) if m is not None]
        return sorted(manifests, key=lambda m: m.id[3:])  # ids sort by time after the kind prefix

    def get(self, job: str, snapshot_id: str) -> Manifest:
        check_name(job, "job name")
        if snapshot_id == LATEST:
            return self.latest(job)
        check_name(snapshot_id, "snapshot id")
        key = manifest_key(job, snapshot_id)
        try:
            raw = self.storage.read(key)
        except FileNotFoundError:
            if job not in self.jobs():
                raise NotFound(
                    f"job {job!r} has no snapshots in {self.uri}: check the job name with `savepoints list`"
                ) from None
            raise NotFound(
                f"snapshot {snapshot_id} of job {job} does not exist in {self.uri}: see `savepoints list --job {job}`"
            ) from None
        return Manifest.from_json(raw, f"{self.uri}/{key}")

    def latest(self, job: str, kind: str | None = None) -> Manifest:
        completed = [
            m for m in self.list(job) if m.status is SnapshotStatus.COMPLETED and (kind is None or m.kind == kind)
        ]
        if not completed:
            if job not in self.jobs():
                raise NotFound(f"job {job!r} has no snapshots in {self.uri}: check the job name with `savepoints list`")
            raise NotFound(f"job {job} has no COMPLETED snapshot in {self.uri}: see `savepoints list --job {job}`")
        return completed[-1]

    def put(self, manifest: Manifest) -> None:
        self.storage.write(manifest_key(manifest.job, manifest.id), manifest.to_json())

    def remove(self, manifest: Manifest) -> None:
        self.storage.delete([manifest_key(manifest.job, manifest.id)])
