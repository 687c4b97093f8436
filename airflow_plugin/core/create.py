"""Take a snapshot: consistent at the latest committed batch N, incremental, verified, manifest last.

Steps: read the restart point of batch N (checkpoint.py) -> write an IN_PROGRESS manifest -> copy every
needed file into content-addressed blobs (files known from an earlier snapshot of the same location
and files whose content the store already holds are not uploaded again) -> check that every blob is
there -> write the COMPLETED manifest. If Spark's cleanup deletes a file mid-copy, start again at a
newer N. A crash at any point leaves at most an IN_PROGRESS manifest and unreferenced blobs, never a
COMPLETED snapshot with a missing file."""

from __future__ import annotations

import hashlib
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import RestartPoint, read_restart_point
from .errors import CheckpointChanged, CheckpointError, SavepointsError
from .manifest import FileEntry, Kind, Manifest, Status, Trigger, blob_key, check_name, new_snapshot_id, utc_now
from .parallel import DEFAULT_CONCURRENCY, run_parallel
from .progress import NullProgress, Progress
from .sinks import sink_position
from .storage import ObjectInfo, Storage, copy_and_hash, open_storage
from .store import SnapshotStore

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
SMALL_FILE = 8 * 1024 * 1024  # read into memory in one go (per thread)


@dataclass(frozen=True)
class SnapshotRequest:
    job: str
    kind: Kind = Kind.SAVEPOINT
    trigger: Trigger = Trigger.MANUAL
    requested_by: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    pinned: bool = False
    sinks: tuple[str, ...] = ()  # output locations of file sinks whose position to record
    deployment: str | None = None
    job_version: str | None = None


@dataclass
class _Known:
    """What earlier snapshots of this job already stored: by source file identity and by content."""

    by_file: dict[tuple[str, int, float], str]
    contents: set[str]

    @classmethod
    def load(cls, store: SnapshotStore, job: str, source: str) -> _Known:
        by_file: dict[tuple[str, int, float], str] = {}
        contents: set[str] = set()
        for manifest in store.list(job):
            if manifest.status is not Status.COMPLETED:
                continue
            for entry in manifest.files:
                contents.add(entry.sha256)
                if manifest.source == source:
                    by_file[(entry.path, entry.size, entry.mtime)] = entry.sha256
        return cls(by_file, contents)


class _Copier:
    """Copies the files of one attempt; thread-safe; uploads each content at most once. The bytes that
    are hashed are exactly the bytes that are stored (read once, or copied once to a private file)."""

    def __init__(self, store: SnapshotStore, checkpoint: Storage, known: _Known, progress: Progress) -> None:
        self.store, self.checkpoint, self.known, self.progress = store, checkpoint, known, progress
        self.lock = threading.Lock()
        self.claimed: set[str] = set()
        self.uploaded_bytes = 0
        self.uploaded_files = 0

    def __call__(self, info: ObjectInfo) -> FileEntry:
        sha = self.known.by_file.get((info.key, info.size, info.mtime))
        if sha is None:
            try:
                sha = self._copy_small(info) if info.size <= SMALL_FILE else self._copy_large(info)
            except FileNotFoundError:
                raise CheckpointChanged(f"{self.checkpoint.uri}/{info.key} was deleted while being copied") from None
        self.progress.advance(info.size)
        return FileEntry(info.key, info.size, sha, info.mtime)

    def _copy_small(self, info: ObjectInfo) -> str:
        data = self.checkpoint.read(info.key)
        self._check_size(info, len(data))
        sha = hashlib.sha256(data).hexdigest()
        if self._claim(sha):
            self.store.storage.write(blob_key(sha), data)
            self._count(len(data))
        return sha

    def _copy_large(self, info: ObjectInfo) -> str:
        with self.checkpoint.fetched(info.key) as source, tempfile.TemporaryDirectory(prefix="savepoints-") as tmp:
            private = Path(tmp) / "copy"
            digest = copy_and_hash(source, private)  # the live file may be replaced; this copy may not
            self._check_size(info, digest.size)
            if self._claim(digest.sha256):
                self.store.storage.upload(private, blob_key(digest.sha256))
                self._count(digest.size)
        return digest.sha256

    def _check_size(self, info: ObjectInfo, size: int) -> None:
        if size != info.size:
            raise CheckpointChanged(
                f"{self.checkpoint.uri}/{info.key} changed size while being copied ({info.size} -> {size})"
            )

    def _claim(self, sha: str) -> bool:
        """Whether this thread should upload `sha`: the store does not hold it and nobody else took it."""
        with self.lock:
            first = sha not in self.claimed
            self.claimed.add(sha)
            return first and sha not in self.known.contents

    def _count(self, size: int) -> None:
        with self.lock:
            self.uploaded_bytes += size
            self.uploaded_files += 1


def create_snapshot(
    store: SnapshotStore,
    checkpoint: Storage,
    request: SnapshotRequest,
    *,
    progress: Progress | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    max_attempts: int = MAX_ATTEMPTS,
    open_location: Callable[[str], Storage] = open_storage,
) -> Manifest:
    """Snapshot `checkpoint` into `store`. Nothing is written before the checkpoint is known to be a
    usable Spark checkpoint with a committed batch."""
    check_name(request.job, "job name")
    for key in request.labels:
        check_name(key, "label key")
    progress = progress or NullProgress()
    started = time.monotonic()
    manifest = Manifest(
        id=new_snapshot_id(request.kind),
        job=request.job,
        kind=request.kind,
        trigger=request.trigger,
        status=Status.IN_PROGRESS,
        source=checkpoint.uri,
        created_at=utc_now(),
        requested_by=request.requested_by,
        deployment=request.deployment,
        job_version=request.job_version,
        pinned=request.pinned,
        labels=dict(request.labels),
    )
    point = _restart_point(checkpoint, max_attempts)  # bad input fails here, before anything is written
    store.put(manifest)
    try:
        last_error: CheckpointChanged | None = None
        for attempt in range(1, max_attempts + 1):
            manifest.attempts = attempt
            if attempt > 1:
                point = _restart_point(checkpoint, max_attempts)
            try:
                return _attempt(
                    store, checkpoint, point, manifest, request, progress, concurrency, started, open_location
                )
            except CheckpointChanged as exc:
                last_error = exc
                log.warning(
                    "snapshot %s, attempt %d at batch %d: %s; retrying at a newer batch",
                    manifest.id,
                    attempt,
                    point.batch_id,
                    exc,
                )
        raise CheckpointError(
            f"snapshot {manifest.id} of job {request.job} gave up after {max_attempts} attempts: {last_error}. "
            "Spark's cleanup deletes files faster than they can be copied: raise "
            "spark.sql.streaming.minBatchesToRetain or snapshot after stopping the query"
        )
    except BaseException as exc:
        _mark_failed(store, manifest, exc)
        raise


def _restart_point(checkpoint: Storage, max_attempts: int) -> RestartPoint:
    for attempt in range(1, max_attempts + 1):
        try:
            return read_restart_point(checkpoint)
        except CheckpointChanged:
            if attempt == max_attempts:
                raise
    raise AssertionError("unreachable")


def _attempt(
    store: SnapshotStore,
    checkpoint: Storage,
    point: RestartPoint,
    manifest: Manifest,
    request: SnapshotRequest,
    progress: Progress,
    concurrency: int,
    started: float,
    open_location: Callable[[str], Storage],
) -> Manifest:
    planned = time.monotonic()
    known = _Known.load(store, request.job, checkpoint.uri)
    copier = _Copier(store, checkpoint, known, progress)
    progress.start(f"snapshot {manifest.id} (batch {point.batch_id})", point.total_bytes, len(point.files))
    try:
        files = sorted(run_parallel(copier, point.files, concurrency=concurrency), key=lambda f: f.path)
    finally:
        progress.finish()
    copied = time.monotonic()

    manifest.query_id = point.query_id
    manifest.batch_id = point.batch_id
    manifest.pending_batch_id = point.pending_batch_id
    manifest.watermark_ms = point.watermark_ms
    manifest.batch_timestamp_ms = point.batch_timestamp_ms
    manifest.source_offsets = point.source_offsets
    manifest.spark_conf = point.spark_conf
    manifest.restore_conf = point.restore_conf
    manifest.operators = point.operators
    manifest.sinks = [{"location": uri, "last_batch_id": sink_position(open_location(uri))} for uri in request.sinks]
    manifest.files = files
    manifest.total_bytes = sum(f.size for f in files)
    manifest.uploaded_bytes = copier.uploaded_bytes
    manifest.uploaded_files = copier.uploaded_files
    finished = time.monotonic()
    manifest.timings = {
        "plan_s": round(planned - started, 3),
        "copy_s": round(copied - planned, 3),
        "total_s": round(finished - started, 3),
    }
    manifest.status = Status.COMPLETED
    manifest.completed_at = utc_now()
    store.put(manifest)  # the commit
    log.info(
        "snapshot %s of job %s COMPLETED at batch %d: %d files, %d bytes, %d uploaded",
        manifest.id,
        manifest.job,
        manifest.batch_id,
        len(files),
        manifest.total_bytes,
        manifest.uploaded_bytes,
    )
    return manifest


def _mark_failed(store: SnapshotStore, manifest: Manifest, exc: BaseException) -> None:
    """Best effort: a snapshot that cannot finish says so (an interrupted one stays IN_PROGRESS)."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return
    manifest.status = Status.FAILED
    manifest.error = str(exc) if isinstance(exc, SavepointsError) else f"{type(exc).__name__}: {exc}"
    manifest.completed_at = utc_now()
    try:
        store.put(manifest)
    except Exception as error:  # the store itself may be what failed; the original error is what matters
        log.warning("could not mark snapshot %s FAILED (it stays IN_PROGRESS): %s", manifest.id, error)
