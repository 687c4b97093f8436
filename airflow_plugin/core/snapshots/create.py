"""Take a snapshot: consistent at the latest committed batch N, incremental, checksummed, manifest last.

Steps: read the restart point of batch N (checkpoint.py) -> write an IN_PROGRESS manifest -> copy every
needed file into content-addressed blobs (files known from an earlier snapshot of the same location
and files whose content the store already holds are not uploaded again) -> write the COMPLETED manifest.
If Spark's cleanup deletes a file mid-copy (or a file changes size), start again at a newer N. A crash at
any point leaves at most an IN_PROGRESS manifest and unreferenced blobs, never a COMPLETED snapshot with a
missing file. Reused blobs are not checked one by one: deletions never race a create (the ordering
argument is in docs/architecture.md, "Retention and garbage collection"); `verify` checks every blob."""

from __future__ import annotations

import hashlib
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointChanged, CheckpointError, SavepointsError
from ..layout import blob_key, check_name
from ..parallel import DEFAULT_CONCURRENCY, run_parallel
from ..progress import NullProgress, Progress
from ..sinks import FILE, SinkRef
from ..sinks import file as file_sink
from ..storage import ObjectInfo, Storage, copy_and_hash, open_storage
from .checkpoint import RestartPoint, read_restart_point
from .manifest import (
    FileEntry,
    Kind,
    Manifest,
    SnapshotStatus,
    Trigger,
    new_snapshot_id,
    parse_labels,
    sink_log_prefix,
    utc_now,
)
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
    sinks: tuple[SinkRef, ...] = ()  # sinks whose position (and file sink log) to record
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
            if manifest.status is not SnapshotStatus.COMPLETED:
                continue
            for entry in manifest.files:
                contents.add(entry.sha256)
                if manifest.source == source:
                    by_file[(entry.path, entry.size, entry.mtime)] = entry.sha256
        return cls(by_file, contents)


class _Copier:
    """Copies the files of one attempt; thread-safe; uploads each content at most once. The bytes that
    are hashed are exactly the bytes that are stored (read once, or copied once to a private file)."""

    def __init__(
        self,
        store: SnapshotStore,
        checkpoint: Storage,
        known: _Known,
        progress: Progress,
        prefix: str = "",
        claimed: set[str] | None = None,
    ) -> None:
        self.store, self.checkpoint, self.known, self.progress = store, checkpoint, known, progress
        self.prefix = prefix  # where the files go in the manifest: "" for the checkpoint, a sink's log elsewhere
        self.lock = threading.Lock()
        self.claimed: set[str] = set() if claimed is None else claimed  # shared: one upload per content
        self.uploaded_bytes = 0
        self.uploaded_files = 0

    def __call__(self, info: ObjectInfo) -> FileEntry:
        path = self.prefix + info.key
        sha = self.known.by_file.get((path, info.size, info.mtime))
        if sha is None:
            try:
                sha = self._copy_small(info) if info.size <= SMALL_FILE else self._copy_large(info)
            except FileNotFoundError:
                raise CheckpointChanged(f"{self.checkpoint.uri}/{info.key} was deleted while being copied") from None
        self.progress.advance(info.size)
        return FileEntry(path, info.size, sha, info.mtime)

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
    labels = parse_labels(request.labels)
    progress = progress or NullProgress()
    started = time.monotonic()
    manifest = Manifest(
        id=new_snapshot_id(request.kind),
        job=request.job,
        kind=request.kind,
        trigger=request.trigger,
        status=SnapshotStatus.IN_PROGRESS,
        source=checkpoint.uri,
        created_at=utc_now(),
        requested_by=request.requested_by,
        deployment=request.deployment,
        job_version=request.job_version,
        pinned=request.pinned,
        labels=labels,
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
    manifest.offsets_version = point.offsets_version
    manifest.spark_conf = point.spark_conf
    manifest.restore_conf = point.restore_conf
    manifest.operators = point.operators
    sink_copiers = _record_sinks(manifest, request.sinks, point.batch_id, open_location, copier)
    files = sorted([*files, *(f for c in sink_copiers for f in c.files)], key=lambda f: f.path)
    manifest.files = files
    manifest.total_bytes = sum(f.size for f in files)
    manifest.uploaded_bytes = copier.uploaded_bytes + sum(c.copier.uploaded_bytes for c in sink_copiers)
    manifest.uploaded_files = copier.uploaded_files + sum(c.copier.uploaded_files for c in sink_copiers)
    finished = time.monotonic()
    manifest.timings = {
        "plan_s": round(planned - started, 3),
        "copy_s": round(copied - planned, 3),
        "total_s": round(finished - started, 3),
    }
    manifest.status = SnapshotStatus.COMPLETED
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


@dataclass
class _SinkCopy:
    copier: _Copier
    files: list[FileEntry]


def _record_sinks(
    manifest: Manifest,
    sinks: tuple[SinkRef, ...],
    batch_id: int,
    open_location: Callable[[str], Storage],
    copier: _Copier,
) -> list[_SinkCopy]:
    """Record each sink; of a file sink also its position and its log as it was at `batch_id` (copied into
    the snapshot under `sink_log_prefix`), so that a restore can check it and rewind it."""
    manifest.sinks = []
    copies = []
    for index, sink in enumerate(sinks):
        record: dict[str, Any] = {"kind": sink.kind, "location": sink.location}
        if sink.kind == FILE:
            output = open_location(sink.location)
            logs = file_sink.log_at(output, batch_id)
            prefix = sink_log_prefix(index)
            sink_copier = _Copier(copier.store, output, copier.known, copier.progress, prefix, copier.claimed)
            try:
                copied = list(run_parallel(sink_copier, logs))
            except CheckpointChanged as exc:  # compacted and cleaned up meanwhile: the next attempt reads anew
                raise CheckpointChanged(f"file sink {sink.location}: {exc}") from None
            copies.append(_SinkCopy(sink_copier, copied))
            record |= {"last_batch_id": file_sink.position(output), "log": prefix}
        manifest.sinks.append(record)
    return copies


def _mark_failed(store: SnapshotStore, manifest: Manifest, exc: BaseException) -> None:
    """Best effort: a snapshot that cannot finish says so (an interrupted one stays IN_PROGRESS)."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return
    manifest.status = SnapshotStatus.FAILED
    manifest.error = str(exc) if isinstance(exc, SavepointsError) else f"{type(exc).__name__}: {exc}"
    manifest.completed_at = utc_now()
    try:
        store.put(manifest)
    except Exception:  # the store itself may be what failed; the original error is what matters
        log.warning("could not mark snapshot %s FAILED", manifest.id, exc_info=True)
