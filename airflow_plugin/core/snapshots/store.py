"""The snapshots of a store: each job's manifests (their keys: layout.py), listed through the job's catalog
(catalog/snapshots.py), read, added, changed and removed so that the catalog stays true to them; the contents they
reference are behind `SnapshotStore.blobs` (blobs.py).

Manifests are written only conditionally: a new one is created (never over another), a change replaces the
version that was read (a change that lost a race is applied again to what won), a removal deletes the
version the caller saw. So a pin racing a delete never writes a deleted snapshot back, and a prune never
deletes a snapshot pinned since it planned."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from .. import layout
from ..catalog.index import Known, RecordIndex
from ..catalog.snapshots import SnapshotEntry, snapshot_catalog
from ..errors import Conflict, NotFound
from ..layout import check_name, manifest_key
from ..parallel import run_parallel
from ..records.manifest import Manifest, SnapshotStatus
from ..storage import Storage
from .blobs import Blobs

log = logging.getLogger(__name__)

LATEST = "latest"
CHANGE_ATTEMPTS = 20  # a manifest changed by others this many times while we changed it: give up
# manifests a store object keeps the bytes of, to read one again with a conditional GET (an operation reads
# the one it resolved again when it plans: latest, then the restore's plan): no bytes when unchanged
RECENT_MANIFESTS = 4


@dataclass(frozen=True)
class Listing:
    """The snapshots of the jobs listed, and the ids whose catalog entry a validation found wrong."""

    entries: list[SnapshotEntry]
    repaired: dict[str, list[str]]  # job -> snapshot ids settled from their manifests


class SnapshotStore:
    """Manifests of one store, their catalogs, and its stored contents (`blobs`)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.blobs = Blobs(storage)
        self._catalogs: dict[str, RecordIndex[SnapshotEntry]] = {}
        self._recent: OrderedDict[str, tuple[str, bytes]] = OrderedDict()  # key -> (version, bytes)
        self._recent_lock = threading.Lock()

    @property
    def uri(self) -> str:
        return self.storage.uri

    def catalog(self, job: str) -> RecordIndex[SnapshotEntry]:
        check_name(job, "job name")
        if job not in self._catalogs:
            self._catalogs[job] = snapshot_catalog(self.storage, job)
        return self._catalogs[job]

    def jobs(self) -> list[str]:
        """The store's job names: one delimited listing of jobs/, not a listing of every key under it."""
        names = self.storage.children(layout.JOBS)
        return [name for name in names if layout.is_valid_name(name)]

    # ------------------------------------------------------------ listing: the catalogs

    def list(self, job: str | None = None) -> list[SnapshotEntry]:
        """The snapshots of one job (or every job), oldest first, as their catalogs list them."""
        jobs = [check_name(job, "job name")] if job is not None else self.jobs()
        found = run_parallel(lambda name: list(self.catalog(name).view().values()), jobs)
        return _oldest_first([entry for entries in found for entry in entries])

    def newer_completed(self, job: str, snapshot_id: str) -> list[SnapshotEntry]:
        """The job's COMPLETED snapshots taken after `snapshot_id`, oldest first: what a restore the source guard
        refuses may restore instead."""
        return [
            entry
            for entry in self.list(job)
            if entry.status is SnapshotStatus.COMPLETED and entry.id[3:] > snapshot_id[3:] and entry.id != snapshot_id
        ]

    def validated(self, job: str | None = None) -> Listing:
        """Like `list`, each catalog first compared with a listing of its manifests (ids, versions) and every
        difference settled from the manifests: for what must not miss a snapshot (garbage collection), and
        for the full listing a person asks for."""
        jobs = [check_name(job, "job name")] if job is not None else self.jobs()
        checked = list(run_parallel(lambda name: (name, *self.catalog(name).validate()), jobs))
        entries = [entry for _, view, _ in checked for entry in view.values()]
        return Listing(_oldest_first(entries), {name: ids for name, _, ids in checked if ids})

    def latest_entry(self, job: str, kind: str | None = None) -> SnapshotEntry:
        check_name(job, "job name")
        completed = [
            e for e in self.list(job) if e.status is SnapshotStatus.COMPLETED and (kind is None or e.kind == kind)
        ]
        if not completed:
            if job not in self.jobs():
                raise NotFound(f"job {job!r} has no snapshots in {self.uri}: check the job name with `savepoints list`")
            raise NotFound(f"job {job} has no COMPLETED snapshot in {self.uri}: see `savepoints list {job}`")
        return completed[-1]

    # ------------------------------------------------------------ reading: the manifests

    def get(self, job: str, snapshot_id: str) -> Manifest:
        """The manifest itself (the truth); `latest`: of the newest COMPLETED snapshot the catalog lists,
        checked against the manifest's version (a catalog found behind is settled, and asked again)."""
        check_name(job, "job name")
        if snapshot_id == LATEST:
            return self.latest(job)
        check_name(snapshot_id, "snapshot id")
        return self._read(job, snapshot_id)[0]

    def latest(self, job: str, kind: str | None = None) -> Manifest:
        for _ in range(3):
            entry = self.latest_entry(job, kind)
            try:
                manifest, version = self._read(job, entry.id)
            except NotFound:
                manifest, version = None, None
            if manifest is not None and version == entry.version:
                return manifest
            log.warning("the catalog of job %s was behind snapshot %s: settling it from its manifest", job, entry.id)
            self.catalog(job).settle([entry.id])
        if manifest is None:
            raise Conflict(f"snapshot {entry.id} of job {job} keeps changing or disappearing: try again")
        return manifest

    def current(self, job: str, snapshot_id: str) -> SnapshotEntry:
        """A snapshot's entry made from its manifest as it is now (by id or `latest`): what a change or a
        delete conditional on its version needs."""
        check_name(job, "job name")
        if snapshot_id == LATEST:
            snapshot_id = self.latest_entry(job).id
        check_name(snapshot_id, "snapshot id")
        manifest, version = self._read(job, snapshot_id)
        return SnapshotEntry.of(manifest, version)

    def manifests(self, entries: Iterable[SnapshotEntry], *, concurrency: int = 16) -> Iterator[Manifest]:
        """The manifests of these entries, read in parallel (those deleted meanwhile are skipped)."""

        def read(entry: SnapshotEntry) -> Manifest | None:
            try:
                return self._read(entry.job, entry.id)[0]
            except NotFound:
                return None

        for manifest in run_parallel(read, entries, concurrency=concurrency):
            if manifest is not None:
                yield manifest

    def _read(self, job: str, snapshot_id: str) -> tuple[Manifest, str]:
        """The manifest as it is now, and its version (a conditional GET when read moments ago)."""
        key = manifest_key(job, snapshot_id)
        with self._recent_lock:
            known = self._recent.get(key)
        try:
            if known is None:
                raw, version = self.storage.read_with_token(key)
            else:
                changed = self.storage.read_if_changed(key, known[0])
                raw, version = (known[1], known[0]) if changed is None else changed
        except FileNotFoundError:
            raise self._missing(job, snapshot_id) from None
        with self._recent_lock:
            self._recent[key] = (version, raw)
            self._recent.move_to_end(key)
            while len(self._recent) > RECENT_MANIFESTS:
                self._recent.popitem(last=False)
        return Manifest.from_json(raw, f"{self.uri}/{key}"), version

    def _missing(self, job: str, snapshot_id: str) -> NotFound:
        if job not in self.jobs():
            return NotFound(f"job {job!r} has no snapshots in {self.uri}: check the job name with `savepoints list`")
        return NotFound(
            f"snapshot {snapshot_id} of job {job} does not exist in {self.uri}: see `savepoints list {job}`"
        )

    # ------------------------------------------------------------ writing: manifest and catalog together

    def add(self, manifest: Manifest) -> None:
        """A new snapshot's first manifest (created: never over another)."""
        with self.catalog(manifest.job).changing([manifest.id]) as known:
            written = self.storage.create(manifest_key(manifest.job, manifest.id), manifest.to_json())
            known[manifest.id] = Known(None, written, SnapshotEntry.of(manifest, written))

    def update(self, job: str, snapshot_id: str, change: Callable[[Manifest], None]) -> Manifest:
        """Read the manifest, `change` it, write it back if nobody wrote it meanwhile, else do it all again on
        what they wrote. NotFound once it is deleted: a change never writes a deleted snapshot back."""
        check_name(snapshot_id, "snapshot id")
        key = manifest_key(job, snapshot_id)
        for _ in range(CHANGE_ATTEMPTS):
            manifest, version = self._read(job, snapshot_id)
            change(manifest)
            with self.catalog(job).changing([snapshot_id]) as known:
                try:
                    written = self.storage.replace(key, manifest.to_json(), version)
                except Conflict:
                    continue
                known[snapshot_id] = Known(version, written, SnapshotEntry.of(manifest, written))
            return manifest
        raise Conflict(f"snapshot {snapshot_id} of job {job} kept changing while it was being changed: try again")

    def remove(self, doomed: Iterable[tuple[str, str, str | None]]) -> list[tuple[str, str, str | None]]:
        """Delete the manifests of these (job, snapshot id, version) snapshots, each only if it still is that
        version (None: whatever it is); returns those left alone because they changed since (pinned, say).
        One already deleted counts as deleted."""
        by_job: dict[str, list[tuple[str, str, str | None]]] = {}
        for snapshot in doomed:
            by_job.setdefault(snapshot[0], []).append(snapshot)
        left = []
        for job, snapshots in sorted(by_job.items()):

            def delete(snapshot: tuple[str, str, str | None]) -> tuple[tuple[str, str, str | None], bool]:
                key, version = manifest_key(snapshot[0], snapshot[1]), snapshot[2]
                try:
                    if version is None:
                        self.storage.delete([key])
                    else:
                        self.storage.delete_if(key, version)
                except Conflict:
                    return snapshot, False
                return snapshot, True

            with self.catalog(job).changing([s[1] for s in snapshots]) as known:
                for snapshot, deleted in run_parallel(delete, snapshots):
                    if deleted:
                        known[snapshot[1]] = Known(snapshot[2], None)
                    else:
                        left.append(snapshot)
        return left


def _oldest_first(entries: list[SnapshotEntry]) -> list[SnapshotEntry]:
    return sorted(entries, key=lambda e: (e.id[3:], e.id))  # ids sort by time after the kind prefix
