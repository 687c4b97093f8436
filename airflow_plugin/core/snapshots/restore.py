"""Restore a snapshot into a NEW checkpoint location (Flink's NO_CLAIM: the snapshot is only read).

`plan_restore` checks everything and returns the plan as data (a dry run prints it); `execute_restore`
carries it out: contents are read with as few requests as the packs allow (blobs.py), every file's
checksum is verified on the way, absolute paths inside transformWithState metadata are rewritten to the
new location, the commit files come last, and on any failure whatever was written is removed again, so
the target is left as it was found.

Incremental (`onto`): the target holds exactly an earlier restore of another snapshot of the same query
(an upgrade restores its live savepoint into the new driver's location while the old version still runs).
Then only the files whose path or content differ travel, files the snapshot does not have are removed,
and the result is exactly what a restore into an empty location gives. A target that is anything else
(a file more or less, another query, a later batch than the snapshot) is refused; a failure leaves the
target empty (it held nothing but the earlier restore).

Over 300 lines: planning (plain and incremental, the sink guard) and executing are one contract."""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

from ..errors import IntegrityError, Refused, SavepointsError, StoreUnavailable
from ..guards import sink as sink_guard
from ..guards import source as source_guard
from ..layout import blob_key
from ..parallel import DEFAULT_CONCURRENCY, largest_first, run_parallel
from ..progress import NullProgress, Progress
from ..records.manifest import SINK_LOGS, FileEntry, Manifest, SnapshotStatus, sink_log_prefix
from ..sinks import DELTA, FILE, GUARDED, SinkRef
from ..sinks import delta as delta_sink
from ..sinks import file as file_sink
from ..sources.kafka import KafkaSettings
from ..spark_app import SparkAccess
from ..storage import LocalStorage, S3Storage, Storage, open_storage, sha256_file, spark_uri
from .blobs import IN_MEMORY, checksum_problem
from .store import SnapshotStore

# transformWithState operator metadata v2 holds absolute schema file paths: state/<op>/_metadata/v2/<b>
_ABSOLUTE_PATH_FILE = re.compile(r"^state/\d+/_metadata/v2/\d+$")
METADATA = "metadata"  # the query's id: {"id": ...}
_SCHEMA_PATH = re.compile(r'"([^"]*?)(/state/\d+/_stateSchema/[^"]*)"')


@dataclass
class RestorePlan:
    manifest: Manifest
    target: Storage
    files: list[FileEntry]
    rewrites: list[str] = field(default_factory=list)  # files whose absolute paths are rewritten
    dropped: list[str] = field(default_factory=list)  # stale checksums of rewritten files
    spark_conf: dict[str, str] = field(default_factory=dict)  # the restored query must set these
    warnings: list[str] = field(default_factory=list)
    rewinds: list[tuple[Storage, sink_guard.Rewind]] = field(default_factory=list)  # carried out first
    query_id: str | None = None  # the restored query's new id (a rewound Delta sink); None: the snapshot's
    onto: Manifest | None = None  # incremental: the snapshot the target already holds a restore of
    removals: list[str] = field(default_factory=list)  # incremental: files of `onto` this snapshot lacks
    unchanged: int = 0  # incremental: files already in place
    sources: source_guard.Guarded = field(default_factory=lambda: source_guard.Guarded(None))  # the source guard's

    @property
    def source_gap(self) -> dict[str, Any] | None:
        """The accepted source gap this restore records (None: every record after the snapshot is still held)."""
        return self.sources.gap(self.target.uri)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def describe(self) -> dict[str, Any]:
        return {
            "snapshot": self.manifest.id,
            "job": self.manifest.job,
            "batch_id": self.manifest.batch_id,
            "resumes_at_batch": (self.manifest.batch_id or 0) + 1,
            "target": self.target.uri,
            "files": len(self.files),
            "bytes": self.total_bytes,
            "rewrites": self.rewrites,
            "dropped": self.dropped,
            "spark_conf": self.spark_conf,
            "warnings": self.warnings,
            "sink_rewinds": [rewind.describe() for _, rewind in self.rewinds],
            **({"new_query_id": self.query_id} if self.query_id else {}),
            **({"onto": self.onto.id, "unchanged": self.unchanged, "removed": len(self.removals)} if self.onto else {}),
            "sources": self.sources.check.to_dict() if self.sources.check else None,
            "accepted_source_gap": self.sources.accepted_gap,
        }


def plan_restore(
    store: SnapshotStore,
    job: str,
    snapshot: str | Manifest,
    target: Storage,
    *,
    rewind_sink: bool = False,
    check_sinks: bool = True,
    open_location: Callable[[str], Storage] = open_storage,
    onto: str | None = None,
    kafka: KafkaSettings | None = None,
    accept_source_gap: bool = False,
    check_sources: bool = True,
    spark: SparkAccess | None = None,
    new_query_id: bool = False,
) -> RestorePlan:
    """Check everything and return what a restore would do; nothing is written. A sink that committed
    batches beyond the snapshot is refused (see sinks/) unless `rewind_sink`: then the plan also moves the
    sink back to the snapshot's batch. `check_sinks=False` for throwaway copies that write no sink (deep
    verify, the pre-flight's noop sink, an upgrade's early restore). `onto`: the id of the snapshot whose
    restore the target holds (an incremental restore, see the module doc). Kafka positions whose records
    the broker (`kafka`) no longer holds are refused (guards/source.py) unless `accept_source_gap`;
    `check_sources=False` for copies that never read a source (deep verify) or are checked again before
    they start (an upgrade's early restore). `spark`: the job's Spark conf and environment, for a rewind that
    runs Spark (a Delta table's RESTORE). `new_query_id`: the restored query gets an id of its own (a blue/green
    upgrade's green runs beside the snapshot's query, and sinks tell queries apart by id). `snapshot`: its id
    (or `latest`), or its manifest as the caller just read it (not read again)."""
    manifest = _completed(store, job, snapshot)
    plan = RestorePlan(manifest, target, [])
    plan.files, plan.dropped, plan.rewrites = _checkpoint_files(manifest)
    if onto is None:
        existing = next(iter(target.list()), None)
        if existing is not None:
            raise Refused(
                f"restore target {target.uri} is not empty (it holds {existing.key}): restore into a new, empty "
                "location; nothing was written"
            )
    else:
        _plan_incremental(plan, _completed(store, job, onto))
    plan.spark_conf = {**manifest.spark_conf, **manifest.restore_conf}
    if check_sinks:  # first: a Delta rewind gives the restored query a new id
        _guard_sinks(store, plan, rewind_sink, open_location, spark)
    if new_query_id and plan.query_id is None:
        plan.query_id = str(uuid.uuid4())
        _rewrite(plan, METADATA)
    if plan.query_id is None:
        plan.warnings.insert(
            0,
            f"the restored query keeps query id {manifest.query_id}: stop the original query before starting "
            "it, and never let both write the same sink",
        )
    if check_sources:
        plan.sources = source_guard.guard(
            manifest,
            kafka,
            accept_gap=accept_source_gap,
            newer=partial(store.newer_completed, manifest.job, manifest.id),
        )
        plan.warnings += plan.sources.warnings()
    return plan


def _completed(store: SnapshotStore, job: str, snapshot: str | Manifest) -> Manifest:
    manifest = store.get(job, snapshot) if isinstance(snapshot, str) else snapshot
    if manifest.status is not SnapshotStatus.COMPLETED:
        detail = f": {manifest.error}" if manifest.error else ""
        raise Refused(
            f"snapshot {manifest.id} of job {job} is {manifest.status}{detail}; nothing was restored. "
            f"Pick a COMPLETED one with `savepoints list {job}`"
        )
    return manifest


def _checkpoint_files(manifest: Manifest) -> tuple[list[FileEntry], list[str], list[str]]:
    """The files a restore writes, the stale checksums it drops, the files whose absolute paths it rewrites."""
    rewritten = {f.path for f in manifest.files if _ABSOLUTE_PATH_FILE.match(f.path)}
    files, dropped = [], []
    for entry in manifest.files:
        if entry.path.startswith(SINK_LOGS):
            continue  # kept for rewinding a sink, not part of the checkpoint
        if entry.path.endswith(".crc") and entry.path.removesuffix(".crc") in rewritten:
            dropped.append(entry.path)
        else:
            files.append(entry)
    return files, dropped, sorted(rewritten)


def _plan_incremental(plan: RestorePlan, onto: Manifest) -> None:
    """Refuse unless the target is exactly a restore of `onto`, an earlier state of the same query; then
    keep only the files to write and list the ones to remove."""
    manifest, target = plan.manifest, plan.target
    refuse = f"cannot restore {manifest.id} incrementally onto {target.uri}"
    if onto.query_id != manifest.query_id:
        raise Refused(f"{refuse}: it holds snapshot {onto.id} of another query ({onto.query_id}); nothing was written")
    if (onto.batch_id or 0) > (manifest.batch_id or 0):
        raise Refused(
            f"{refuse}: it holds batch {onto.batch_id}, later than the snapshot's {manifest.batch_id}; "
            "nothing was written"
        )
    before, _, rewritten = _checkpoint_files(onto)
    expected = {f.path: f for f in before}
    present = {info.key: info.size for info in target.list()}
    odd = sorted(
        set(present) ^ set(expected)
        | {p for p, size in present.items() if p in expected and p not in rewritten and size != expected[p].size}
    )
    if odd:
        raise Refused(
            f"{refuse}: it is not exactly the restore of snapshot {onto.id} ({len(odd)} files differ, e.g. {odd[0]}): "
            "restore into a new, empty location; nothing was written"
        )
    final = {f.path for f in plan.files}
    plan.onto = onto
    plan.removals = sorted(set(expected) - final)
    changed = [f for f in plan.files if f.path not in expected or expected[f.path].sha256 != f.sha256]
    plan.unchanged = len(plan.files) - len(changed)
    plan.files = changed


def _guard_sinks(
    store: SnapshotStore,
    plan: RestorePlan,
    rewind: bool,
    open_location: Callable[[str], Storage],
    spark: SparkAccess | None,
) -> None:
    manifest = plan.manifest
    bound = manifest.sink_bound
    for index, sink in enumerate(manifest.sinks):
        kind, location = sink.get("kind", FILE), sink["location"]
        if kind not in GUARDED:
            plan.warnings.append(f"sink {location} is not guarded (only {', '.join(GUARDED)} sinks are checked)")
            continue
        if bound is None:
            continue
        if kind == DELTA:
            _guard_delta(plan, sink, open_location(location), bound, rewind, spark)
            continue
        output = open_location(location)
        found = sink_guard.ahead(SinkRef(FILE, location), output, bound)
        if found is None:
            continue
        skipped = found.skipped
        if not rewind:
            raise _sink_ahead(
                manifest,
                found.holds,
                skipped,
                f"its output after batch {bound} is moved aside into {location.rstrip('/')}/{file_sink.QUARANTINE} "
                "and written again",
            )
        saved = _saved_sink_log(store, manifest, index)
        rewind_plan = file_sink.plan_rewind(output, saved, bound, manifest.id)
        plan.rewinds.append((output, rewind_plan))
        plan.warnings.append(
            f"file sink {location} is rewound to batch {bound}: batches {skipped} "
            f"({len(rewind_plan.data)} data files) move to {rewind_plan.describe()['quarantine']} and run again"
        )


def _sink_ahead(manifest: Manifest, what: str, skipped: str, rewound: str) -> Refused:
    """The guard's refusal: what the sink holds beyond the snapshot, what a restore would do, the way out."""
    consequence = (
        "their state is never written, so the restored query fails on its first new batch"
        if manifest.operators
        else "their new records would be lost"
    )
    return Refused(
        f"{what}, beyond batch {manifest.sink_bound} of snapshot {manifest.id}: a restore would skip batches "
        f"{skipped} as already written ({consequence}). Rewind the sink with --rewind-sink ({rewound}), "
        "or restore a newer snapshot; nothing was written"
    )


def _guard_delta(
    plan: RestorePlan,
    sink: dict[str, Any],
    table: Storage,
    bound: int,
    rewind: bool,
    spark: SparkAccess | None,
) -> None:
    """A Delta table is ahead when it holds streaming writes made after the snapshot's table version."""
    location, version = sink["location"], sink.get("version")
    if version is None:
        if delta_sink.is_table(table):
            raise Refused(
                f"Delta table {location} did not exist at snapshot {plan.manifest.id}, and a rewind cannot take "
                "it back to before its first version: move the table aside (or restore a newer snapshot); "
                "nothing was written"
            )
        return
    writes = delta_sink.writes_after(table, int(version))
    if not writes:
        return
    if not rewind:
        raise _sink_ahead(
            plan.manifest,
            f"Delta table {location} holds {delta_sink.describe_writes(writes)} written after its version {version}",
            f"{bound + 1}..{max(w.batch_id for w in writes)}",
            f"Delta's RESTORE takes the table back to version {version}, its later files kept until VACUUM",
        )
    rewind_plan = delta_sink.plan_rewind(table, int(version), writes, spark)
    plan.rewinds.append((table, rewind_plan))
    plan.query_id = rewind_plan.query_id
    _rewrite(plan, METADATA)
    plan.warnings.append(rewind_plan.summary())


def _rewrite(plan: RestorePlan, path: str) -> None:
    """Write `path` changed (see _Writer.write); its stale checksum (Spark's `<name>.crc`) is left out."""
    plan.rewrites = sorted({*plan.rewrites, path})
    if path not in {f.path for f in plan.files}:  # an incremental restore: written even if unchanged
        plan.files += [f for f in plan.manifest.files if f.path == path]
    checksum = f"{path}.crc"
    plan.dropped += [f.path for f in plan.files if f.path == checksum]
    plan.files = [f for f in plan.files if f.path != checksum]


def _saved_sink_log(store: SnapshotStore, manifest: Manifest, index: int) -> dict[str, bytes] | None:
    """The sink's log files as the snapshot kept them (none in snapshots taken before sinks were recorded)."""
    prefix = sink_log_prefix(index) + file_sink.LOG_DIR
    kept = [entry for entry in manifest.files if entry.path.startswith(prefix)]
    if not kept:
        return None
    return {entry.path[len(prefix) :]: store.blobs.read(entry) for entry in kept}


def execute_restore(
    store: SnapshotStore,
    plan: RestorePlan,
    *,
    progress: Progress | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> dict[str, Any]:
    progress = progress or NullProgress()
    target = plan.target
    writer = _Writer(plan, spark_uri(target))
    started = time.monotonic()
    for output, rewind in plan.rewinds:  # first: the sink is back at batch N before anything can run on N
        sink_guard.execute_rewind(output, rewind)
    # commits/ last: until the commit exists, Spark does not take the location for a restorable batch
    first = [f for f in plan.files if not f.path.startswith("commits/")]
    last = [f for f in plan.files if f.path.startswith("commits/")]
    progress.start(f"restore {plan.manifest.id} -> {target.uri}", plan.total_bytes, len(plan.files))
    try:
        target.delete(plan.removals)
        for batch in (first, last):
            within = {f.path for f in batch if writer.copies(store, f)}  # within S3: no bytes through here
            copied, batch = [f for f in batch if f.path in within], [f for f in batch if f.path not in within]
            copied = largest_first(copied)  # of each kind, the largest first: the last to end is a small one
            copies = cast(S3Storage, target).copy_concurrency(concurrency) if copied else concurrency
            for entry in run_parallel(lambda e: writer.copy(store, e), copied, concurrency=copies):
                progress.advance(entry.size)
            small = [f for f in batch if f.size <= IN_MEMORY]
            for entry in store.blobs.read_each(small, writer.write, concurrency=concurrency):
                progress.advance(entry.size)
            large = largest_first(f for f in batch if f.size > IN_MEMORY)
            for entry in run_parallel(lambda e: writer.download(store, e), large, concurrency=concurrency):
                progress.advance(entry.size)
    except BaseException as exc:
        # an incremental target held nothing but the earlier restore: left empty, never half of each
        written = [info.key for info in target.list()] if plan.onto else writer.written
        _remove_partial(plan, written, exc)
        raise
    finally:
        progress.finish()
    if (gap := plan.source_gap) is not None:
        # the accepted gap joins the snapshot's history (on the manifest as it is now: pin and labels may have changed)
        store.update(plan.manifest.job, plan.manifest.id, lambda current: current.history.append(gap))
    return {**plan.describe(), "seconds": round(time.monotonic() - started, 3)}


def _remove_partial(plan: RestorePlan, written: list[str], failure: BaseException) -> None:
    """Leave the target as it was found: commits/ first (so that a cleanup failing half-way never leaves
    what looks like a restorable batch), then the rest. If the cleanup fails too, say what is left."""
    commits = [path for path in written if path.startswith("commits/")]
    rest = [path for path in written if not path.startswith("commits/")]
    for paths, left in ((commits, "a partial copy, commits/ included"), (rest, "a partial copy without commits/")):
        try:
            plan.target.delete(paths)
        except Exception as cleanup:
            kind = type(failure) if isinstance(failure, SavepointsError) else StoreUnavailable
            raise kind(
                f"restore of snapshot {plan.manifest.id} into {plan.target.uri} failed ({failure}), and removing "
                f"the files it had written failed too ({cleanup}): {plan.target.uri} holds {left}; delete it before "
                "restoring there again"
            ) from failure


class _Writer:
    """Puts checked contents into place: beside its destination first (so that the final move is an
    atomic rename, and Spark ignores the dot-name meanwhile), or with one atomic write to a remote target."""

    def __init__(self, plan: RestorePlan, root: str) -> None:
        self.plan, self.root = plan, root
        self.written: list[str] = []
        self.directories: set[Path] = set()

    def write(self, entry: FileEntry, data: bytes | None) -> FileEntry:
        problem = checksum_problem(entry, data)
        if problem is not None or data is None:
            raise self._integrity(entry, problem or "")
        if entry.path == METADATA and self.plan.query_id is not None:
            data = json.dumps({**json.loads(data), "id": self.plan.query_id}).encode()
        elif entry.path in self.plan.rewrites:
            data = _SCHEMA_PATH.sub(lambda m: f'"{self.root}{m.group(2)}"', data.decode()).encode()
        self.written.append(entry.path)  # before the write: a failure mid-write is cleaned up too
        destination = self.plan.target.local_path(entry.path)
        if destination is None:
            self.plan.target.write(entry.path, data)
            return entry
        local = self._scratch(destination)
        try:
            local.write_bytes(data)
            local.replace(destination)
        finally:
            local.unlink(missing_ok=True)
        return entry

    def copies(self, store: SnapshotStore, entry: FileEntry) -> bool:
        """Whether S3 copies this content into place itself: a content stored as its own object, restored
        unchanged into a target on the store's S3."""
        target = self.plan.target
        return (
            isinstance(target, S3Storage)
            and target.copies_within(store.storage, entry.size)
            and entry.key == blob_key(entry.sha256)
            and entry.path not in self.plan.rewrites
        )

    def copy(self, store: SnapshotStore, entry: FileEntry) -> FileEntry:
        """CopyObject from the store into place; S3's SHA-256 of what it copied is checked against the
        manifest's. A service that computes none: copied through here instead."""
        target, source = cast(S3Storage, self.plan.target), cast(S3Storage, store.storage)
        self.written.append(entry.path)
        try:
            sha = target.copy_from(source, entry.key, entry.path)
        except FileNotFoundError:
            raise self._integrity(entry, f"{entry.path}: stored content {entry.key} is missing") from None
        if sha is None:
            return self.download(store, entry)
        if sha != entry.sha256:
            raise self._integrity(entry, "checksum")
        return entry

    def download(self, store: SnapshotStore, entry: FileEntry) -> FileEntry:
        """A content too large for memory: streamed to a scratch file, checked, moved into place."""
        destination = self.plan.target.local_path(entry.path)
        local = self._scratch(destination)
        self.written.append(entry.path)
        try:
            try:
                store.blobs.download(entry, local)
            except FileNotFoundError:
                raise self._integrity(entry, f"{entry.path}: stored content {entry.key} is missing") from None
            digest = sha256_file(local)
            if digest.sha256 != entry.sha256 or digest.size != entry.size:
                raise self._integrity(entry, "checksum")
            if destination is not None:
                local.replace(destination)
            else:
                self.plan.target.upload(local, entry.path)
        finally:
            local.unlink(missing_ok=True)
        return entry

    def _integrity(self, entry: FileEntry, problem: str) -> IntegrityError:
        snapshot = self.plan.manifest.id
        if "missing" in problem:
            return IntegrityError(
                f"snapshot {snapshot}: stored content of {entry.path} ({entry.key}) is missing; "
                "restore another snapshot"
            )
        return IntegrityError(
            f"snapshot {snapshot}: {entry.path} does not match its checksum (stored content {entry.key} "
            f"{entry.byte_range} is corrupt); restore another snapshot and run `savepoints verify`"
        )

    def _scratch(self, destination: Path | None) -> Path:
        directory = destination.parent if destination is not None else Path(tempfile.gettempdir())
        if directory not in self.directories:
            directory.mkdir(parents=True, exist_ok=True)
            self.directories.add(directory)
        name = destination.name if destination is not None else "restore"
        return directory / f".{name}.{secrets.token_hex(8)}.tmp"


def restore_scratch(
    store: SnapshotStore, job: str, snapshot_id: str, directory: Path, *, concurrency: int = DEFAULT_CONCURRENCY
) -> RestorePlan:
    """Restore a snapshot into `directory` (new, local) for a Spark tool that only reads it (deep verify,
    inspect, diff): no sink is checked or written, no source read, and nothing live is ever touched."""
    plan = plan_restore(store, job, snapshot_id, LocalStorage(directory), check_sinks=False, check_sources=False)
    execute_restore(store, plan, concurrency=concurrency)
    return plan
