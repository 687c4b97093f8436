"""Take a snapshot: consistent at the latest committed batch N, incremental, checksummed, manifest last.

Steps: read the restart point of batch N (checkpoint.py) -> write an IN_PROGRESS manifest -> store every
needed file's content (blobs.py: small ones into packs, large ones as single objects; files known from an
earlier snapshot of the same location and contents the job's recent snapshots already hold are not stored
again) -> write the last pack -> write the COMPLETED manifest (keeping what others changed meanwhile: a
pin). If Spark's cleanup deletes a file mid-copy (or a file changes size), start again at a newer N. A crash
at any point leaves at most an IN_PROGRESS manifest and unreferenced objects, never a COMPLETED snapshot with
a missing file. Reused contents are not checked one by one: deletions never race a create (the ordering
argument is in docs/architecture.md, "Retention and garbage collection"); `verify` checks every content.

Over 300 lines: the copy (hash exactly what is stored, deduplicate, pack), the sink logs and the retries
are one transaction that ends in the manifest; split, each part would need the others' state."""

from __future__ import annotations

import contextvars
import hashlib
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from ..catalog.snapshots import SnapshotEntry
from ..errors import CheckpointChanged, CheckpointError, Conflict, SavepointsError
from ..layout import blob_key, check_name
from ..parallel import DEFAULT_CONCURRENCY, largest_first, run_parallel
from ..progress import NullProgress, Progress
from ..records.manifest import (
    FileEntry,
    Kind,
    Manifest,
    SnapshotStatus,
    Trigger,
    new_snapshot_id,
    parse_labels,
    sink_log_prefix,
)
from ..sinks import DELTA, FILE, SinkRef
from ..sinks import delta as delta_sink
from ..sinks import file as file_sink
from ..storage import ObjectInfo, S3Storage, Storage, copy_and_hash, open_storage
from ..timestamps import utc_now
from .blobs import BlobWriter
from .checkpoint import Identity, RestartPoint, read_restart_point, zip_listings
from .state_stats import state_stats
from .store import SnapshotStore

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
SMALL_FILE = 8 * 1024 * 1024  # a task copies files of up to this many bytes together
# Earlier COMPLETED snapshots whose contents a create reuses: the newest of the same checkpoint location and
# the job's newest (besides those the request names): a bounded read however long the history is
REUSE_SAME_SOURCE = 2
REUSE_RECENT = 2
# What others may change while a create runs (pin, a label, a gap record, a verdict): its commit keeps them
_NOT_THE_CREATES = ("pinned", "labels", "history", "verification")


@dataclass(frozen=True)
class SnapshotRequest:
    job: str
    kind: Kind = Kind.SAVEPOINT
    trigger: Trigger = Trigger.MANUAL
    requested_by: str = ""
    request_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    pinned: bool = False
    sinks: tuple[SinkRef, ...] = ()  # sinks whose position (and file sink log) to record
    deployment: str | None = None
    job_version: str | None = None
    gate: dict[str, Any] | None = None  # the deployment's gate interval, when its writes are gated
    # snapshots whose contents this one likely shares (the one its deployment was restored from), besides the
    # job's newest: a restored checkpoint's files are byte-identical to its snapshot's
    reuse_from: tuple[str, ...] = ()
    # the query's state as its progress reported it (a managed job's heartbeat: name, rows per operator)
    state_progress: tuple[dict[str, Any], ...] = ()


@dataclass
class _Known:
    """What earlier snapshots of this job already stored: by source file identity and by content, each with
    the object and offset that hold it, and what the RocksDB zips they held list (checkpoint.py `zip_listings`).
    From a bounded number of manifests (`earlier`)."""

    by_file: dict[Identity, FileEntry]
    contents: dict[str, tuple[str, int]]
    zips: dict[Identity, list[tuple[str, int]]] = field(default_factory=dict)  # what their RocksDB zips list

    @classmethod
    def load(cls, store: SnapshotStore, request: SnapshotRequest, source: str) -> _Known:
        by_file: dict[Identity, FileEntry] = {}
        contents: dict[str, tuple[str, int]] = {}
        zips: dict[Identity, list[tuple[str, int]]] = {}
        for manifest in store.manifests(earlier(store.list(request.job), request.reuse_from, source)):
            for entry in manifest.files:
                contents[entry.sha256] = (entry.key, entry.offset)
                if manifest.source == source:
                    by_file[(entry.path, entry.size, entry.mtime)] = entry
            if manifest.source == source:
                zips.update(zip_listings((entry.path, entry.size, entry.mtime) for entry in manifest.files))
        return cls(by_file, contents, zips)


def earlier(entries: list[SnapshotEntry], reuse_from: tuple[str, ...], source: str) -> list[SnapshotEntry]:
    """The COMPLETED snapshots a create reads to reuse contents: the newest of the same location, the job's
    newest, and those named; oldest first. Skipping the others costs at most storing a content again."""
    completed = [e for e in entries if e.status is SnapshotStatus.COMPLETED]
    same = [e for e in completed if e.source == source][-REUSE_SAME_SOURCE:]
    chosen = {e.id: e for e in [*same, *completed[-REUSE_RECENT:], *(e for e in completed if e.id in reuse_from)]}
    return sorted(chosen.values(), key=lambda e: e.id[3:])


def _batches(files: list[ObjectInfo], count: int = 64, size: int = SMALL_FILE) -> Iterator[list[ObjectInfo]]:
    """Files in groups of up to `count` files and `size` bytes: one task each (a task per small file costs
    more than copying it)."""
    batch: list[ObjectInfo] = []
    total = 0
    for info in files:
        if batch and (len(batch) == count or total + info.size > size):
            yield batch
            batch, total = [], 0
        batch.append(info)
        total += info.size
    if batch:
        yield batch


class _Copier:
    """Copies the files of one attempt; thread-safe; stores each content at most once, small ones into
    packs (blobs.py). The bytes that are hashed are exactly the bytes that are stored (read once, or
    copied once to a private file)."""

    def __init__(
        self,
        checkpoint: Storage,
        known: _Known,
        progress: Progress,
        writer: BlobWriter,
        prefix: str = "",
        stored: dict[str, tuple[str, int]] | None = None,
    ) -> None:
        self.checkpoint, self.known, self.progress, self.writer = checkpoint, known, progress, writer
        self.prefix = prefix  # where the files go in the manifest: "" for the checkpoint, a sink's log elsewhere
        self.lock = threading.Lock()
        self.stored: dict[str, tuple[str, int]] = {} if stored is None else stored  # shared: once per content
        self.uploaded_bytes = 0
        self.uploaded_files = 0
        self.copied_bytes = 0  # of uploaded_bytes: copied by S3 itself, not through this client

    def batch(self, infos: list[ObjectInfo]) -> list[FileEntry]:
        return [self(info) for info in infos]

    def copied_within(self, info: ObjectInfo) -> bool:
        """Whether the store's S3 copies this file itself where it must be stored (no bytes through here)."""
        return self.writer.copies_from(self.checkpoint, info.size) is not None and not self.writer.fits_pack(
            info.size, self.checkpoint
        )

    def __call__(self, info: ObjectInfo) -> FileEntry:
        path = self.prefix + info.key
        hit = self.known.by_file.get((path, info.size, info.mtime))
        if hit is not None:
            entry = FileEntry(path, info.size, hit.sha256, info.mtime, hit.key, hit.offset)
        else:
            try:
                packed = self.writer.fits_pack(info.size, self.checkpoint)
                sha, (key, offset) = self._copy_small(info) if packed else self._copy_large(info)
            except FileNotFoundError:
                raise CheckpointChanged(f"{self.checkpoint.uri}/{info.key} was deleted while being copied") from None
            entry = FileEntry(path, info.size, sha, info.mtime, key, offset)
        self.progress.advance(info.size)
        return entry

    def _copy_small(self, info: ObjectInfo) -> tuple[str, tuple[str, int]]:
        data = self.checkpoint.read(info.key)
        self._check_size(info, len(data))
        sha = hashlib.sha256(data).hexdigest()
        with self.lock:
            location = self._lookup(sha)
            sealed = None
            if location is None:
                key, offset, sealed = self.writer.append(data)
                location = self.stored[sha] = (key, offset)
                self._count(len(data))
        self.writer.write(sealed)
        return sha, location

    def _copy_large(self, info: ObjectInfo) -> tuple[str, tuple[str, int]]:
        store = self.writer.copies_from(self.checkpoint, info.size)
        if store is not None:
            return self._copy_in_s3(store, cast(S3Storage, self.checkpoint), info)
        with self.checkpoint.fetched(info.key) as source, tempfile.TemporaryDirectory(prefix="savepoints-") as tmp:
            private = Path(tmp) / "copy"
            digest = copy_and_hash(source, private)  # the live file may be replaced; this copy may not
            self._check_size(info, digest.size)
            location, new = self._claim(digest.sha256, digest.size)
            if new:
                self.writer.put_large(digest.sha256, private)
        return digest.sha256, location

    def _copy_in_s3(self, store: S3Storage, source: S3Storage, info: ObjectInfo) -> tuple[str, tuple[str, int]]:
        """A large file of a checkpoint on the store's S3, its bytes never uploaded from here: when S3 knows its
        SHA-256 (written with one), a HEAD and, for a new content, one copy to its blob; otherwise a copy to a
        staging object that S3 checksums, then to its blob when new. Where the server computes no checksum of a
        copy (S3Proxy; learned from the first staging copy), the file is read here to hash it and copied within
        S3 by its ETag: its bytes come down once, and none go up."""
        head = source.checksummed(info.key)
        if head.sha256 is not None:
            self._check_size(info, head.size)
            location, new = self._claim(head.sha256, head.size)
            if new and not self.writer.copy_known(store, source, info.key, head.sha256, head.etag):
                raise CheckpointChanged(f"{source.uri}/{info.key} was replaced while being copied")
            if new:
                self._count_copied(head.size)
            return head.sha256, location
        if self.writer.copies_checksummed is None:  # the first such file learns it for all, the others wait
            with self.writer.learning:
                if self.writer.copies_checksummed is None:
                    return self._stage(store, source, info, head.etag)
        if self.writer.copies_checksummed is False:
            return self._hash_and_copy(store, source, info, head.etag)
        return self._stage(store, source, info, head.etag)

    def _stage(self, store: S3Storage, source: S3Storage, info: ObjectInfo, etag: str) -> tuple[str, tuple[str, int]]:
        """A copy to a staging object that S3 checksums, then to its blob when new; where the copy says no
        checksum, this server's copies never do (S3Proxy): hashed by reading instead, and no file stages again."""
        staged, sha, size = self.writer.stage(store, source, info.key)
        try:
            self.writer.copies_checksummed = sha is not None
            if sha is None:
                return self._hash_and_copy(store, source, info, etag)
            self._check_size(info, size)
            location, new = self._claim(sha, size)
            if new:
                self.writer.promote(store, staged, sha)
                self._count_copied(size)
        finally:
            store.delete([staged])
        return sha, location

    def _hash_and_copy(
        self, store: S3Storage, source: S3Storage, info: ObjectInfo, etag: str
    ) -> tuple[str, tuple[str, int]]:
        """Hash the version of a file its HEAD saw (ranged GETs, each If-Match its ETag), and copy exactly that
        version to its blob (CopySourceIfMatch): a file replaced in between fails either, and the attempt
        starts again at a newer batch. Where the copy says what it copied (a checksum), that is checked too: a
        server that ignores the condition (moto does) must not store a newer version under the hashed one's
        checksum."""
        try:
            sha, size = source.hash_by_reading(info.key, etag)
            self._check_size(info, size)
            location, new = self._claim(sha, size)
            if new:
                copied = self.writer.copy_version(store, source, info.key, blob_key(sha), etag, sha)
                if copied is not None and copied != sha:
                    store.delete([blob_key(sha)])
                    raise Conflict(f"{source.uri}/{info.key} copied as {copied}, hashed as {sha}")
                self._count_copied(size)
        except Conflict:
            raise CheckpointChanged(f"{source.uri}/{info.key} was replaced while being copied") from None
        return sha, location

    def _check_size(self, info: ObjectInfo, size: int) -> None:
        if size != info.size:
            raise CheckpointChanged(
                f"{self.checkpoint.uri}/{info.key} changed size while being copied ({info.size} -> {size})"
            )

    def _lookup(self, sha: str) -> tuple[str, int] | None:
        """Where the store (or this attempt) already holds `sha`; call with the lock held."""
        return self.known.contents.get(sha) or self.stored.get(sha)

    def _claim(self, sha: str, size: int) -> tuple[tuple[str, int], bool]:
        """Where a content too large for a pack is stored, and whether this thread must store it (nobody
        holds or took it). Another thread may still be uploading what it claimed: the manifest is written
        only after all have finished."""
        with self.lock:
            found = self._lookup(sha)
            if found is not None:
                return found, False
            location = self.stored[sha] = (blob_key(sha), 0)
            self._count(size)
        return location, True

    def _count_copied(self, size: int) -> None:
        with self.lock:
            self.copied_bytes += size

    def _count(self, size: int) -> None:
        """Call with the lock held."""
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
        request_id=request.request_id,
        deployment=request.deployment,
        job_version=request.job_version,
        gate=request.gate,
        pinned=request.pinned,
        labels=labels,
    )
    # the earlier snapshots' zip file lists spare reading unchanged zips (facts of the zips, not stored contents)
    point = _restart_point(checkpoint, max_attempts, _Known.load(store, request, checkpoint.uri))
    # bad input failed above, before anything is written. What the store holds is read only once this create is in
    # flight (its IN_PROGRESS manifest written): a delete or prune meanwhile keeps what an in-flight create may
    # reuse, and what one removed before is not reused (records/manifest.py `in_flight`)
    store.add(manifest)
    try:
        known = _Known.load(store, request, checkpoint.uri)  # read once: an attempt's retry gains nothing anew
        last_error: CheckpointChanged | None = None
        for attempt in range(1, max_attempts + 1):
            manifest.attempts = attempt
            if attempt > 1:
                point = _restart_point(checkpoint, max_attempts, known)
            try:
                return _attempt(
                    store, checkpoint, point, known, manifest, request, progress, concurrency, started, open_location
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


def _restart_point(checkpoint: Storage, max_attempts: int, known: _Known) -> RestartPoint:
    for attempt in range(1, max_attempts + 1):
        try:
            return read_restart_point(checkpoint, known.zips)
        except CheckpointChanged:
            if attempt == max_attempts:
                raise
    raise AssertionError("unreachable")


def _attempt(
    store: SnapshotStore,
    checkpoint: Storage,
    point: RestartPoint,
    known: _Known,
    manifest: Manifest,
    request: SnapshotRequest,
    progress: Progress,
    concurrency: int,
    started: float,
    open_location: Callable[[str], Storage],
) -> Manifest:
    planned = time.monotonic()
    writer = store.blobs.writer()
    copier = _Copier(checkpoint, known, progress, writer)
    progress.start(f"snapshot {manifest.id} (batch {point.batch_id})", point.total_bytes, len(point.files))
    try:
        files = _copy(copier, point.files, concurrency)
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
    manifest.state = state_stats(((f.key, f.size) for f in point.files), point.operators, list(request.state_progress))
    sink_copiers = _record_sinks(manifest, request.sinks, open_location, copier)
    writer.flush()  # the last pack: every content the manifest references is stored before the commit
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
    _write(store, manifest)  # the commit
    log.info(
        "snapshot %s of job %s COMPLETED at batch %d: %d files, %d bytes, %d stored anew (%d of them copied by S3)",
        manifest.id,
        manifest.job,
        manifest.batch_id,
        len(files),
        manifest.total_bytes,
        manifest.uploaded_bytes,
        copier.copied_bytes + sum(c.copier.copied_bytes for c in sink_copiers),
    )
    return manifest


def _copy(copier: _Copier, files: list[ObjectInfo], concurrency: int) -> list[FileEntry]:
    """Copy every file: the ones whose bytes come through here (small ones packed, in batches) `concurrency` at
    once, and beside them the ones the store's S3 copies itself, a task each, more at once
    (`S3Storage.copy_concurrency`): a copy costs this client a request and no bytes (at 16 at once the first
    savepoint of a live checkpoint took 1.3 to 1.4x the time of `s5cmd cp`, which runs up to 256). A failure of
    either part is raised once the other has finished."""
    within = [info for info in files if copier.copied_within(info)]
    through = [info for info in files if not copier.copied_within(info)]
    store = copier.writer.storage
    wide = store.copy_concurrency(concurrency) if isinstance(store, S3Storage) else concurrency

    def transfers() -> list[FileEntry]:
        return [
            entry for batch in run_parallel(copier.batch, _batches(through), concurrency=concurrency) for entry in batch
        ]

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="savepoints-transfers") as side:
        moved = side.submit(contextvars.copy_context().run, transfers)
        copied = list(run_parallel(copier, largest_first(within), concurrency=wide))
        return [*moved.result(), *copied]


@dataclass
class _SinkCopy:
    copier: _Copier
    files: list[FileEntry]


def _record_sinks(
    manifest: Manifest,
    sinks: tuple[SinkRef, ...],
    open_location: Callable[[str], Storage],
    copier: _Copier,
) -> list[_SinkCopy]:
    """Record each sink and where it stood at the snapshot: of a file sink its position and its log as it
    was at the batch (copied into the snapshot under `sink_log_prefix`), of a Delta table the table version
    holding the query's batches up to the sink bound; so that a restore can check it and rewind it."""
    manifest.sinks = []
    copies = []
    batch_id, bound = cast(int, manifest.batch_id), manifest.sink_bound
    for index, sink in enumerate(sinks):
        record: dict[str, Any] = {"kind": sink.kind, "location": sink.location}
        if sink.kind == FILE:
            output = open_location(sink.location)
            logs = file_sink.log_at(output, batch_id)
            prefix = sink_log_prefix(index)
            sink_copier = _Copier(output, copier.known, copier.progress, copier.writer, prefix, copier.stored)
            try:
                copied = list(run_parallel(sink_copier, logs))
            except CheckpointChanged as exc:  # compacted and cleaned up meanwhile: the next attempt reads anew
                raise CheckpointChanged(f"file sink {sink.location}: {exc}") from None
            copies.append(_SinkCopy(sink_copier, copied))
            record |= {"last_batch_id": file_sink.position(output), "log": prefix}
        elif sink.kind == DELTA and manifest.query_id and bound is not None:
            table = open_location(sink.location)
            planned = manifest.batch_timestamp_ms
            record |= {
                "last_batch_id": delta_sink.last_batch(table, manifest.query_id, planned),
                "version": delta_sink.version_at(table, manifest.query_id, bound, planned),
            }
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
        _write(store, manifest)
    except Exception as error:  # the store itself may be what failed; the original error is what matters
        log.warning("could not mark snapshot %s FAILED (it stays IN_PROGRESS): %s", manifest.id, error)


def _write(store: SnapshotStore, manifest: Manifest) -> None:
    """The create's manifest over the one in the store, keeping what others changed there meanwhile (a pin).
    A snapshot deleted while it was taken stays deleted (NotFound)."""

    def take(current: Manifest) -> None:
        for f in fields(Manifest):
            if f.name not in _NOT_THE_CREATES:
                setattr(current, f.name, getattr(manifest, f.name))

    written = store.update(manifest.job, manifest.id, take)
    for name in _NOT_THE_CREATES:
        setattr(manifest, name, getattr(written, name))
