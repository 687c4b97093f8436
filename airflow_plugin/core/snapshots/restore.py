"""Restore a snapshot into a NEW checkpoint location (Flink's NO_CLAIM: the snapshot is only read).

`plan_restore` checks everything and returns the plan as data (a dry run prints it); `execute_restore`
carries it out: every file's checksum is verified on the way, absolute paths inside transformWithState
metadata are rewritten to the new location, the commit files come last, and on any failure whatever
was written is removed again, so the target is left as it was found."""

from __future__ import annotations

import hashlib
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, Refused
from ..parallel import DEFAULT_CONCURRENCY, run_parallel
from ..progress import NullProgress, Progress
from ..sinks import FILE, GUARDED
from ..sinks import file as file_sink
from ..sources.kafka import KafkaSettings
from ..storage import Storage, open_storage, sha256_file, spark_uri
from . import source_guard
from .manifest import SINK_LOGS, FileEntry, Manifest, SnapshotStatus, sink_log_prefix
from .store import SnapshotStore

# transformWithState operator metadata v2 holds absolute schema file paths: state/<op>/_metadata/v2/<b>
_ABSOLUTE_PATH_FILE = re.compile(r"^state/\d+/_metadata/v2/\d+$")
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
    rewinds: list[tuple[Storage, file_sink.Rewind]] = field(default_factory=list)  # sinks moved back first
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
            "sources": self.sources.check.to_dict() if self.sources.check else None,
            "accepted_source_gap": self.sources.accepted_gap,
        }


def plan_restore(
    store: SnapshotStore,
    job: str,
    snapshot_id: str,
    target: Storage,
    *,
    rewind_sink: bool = False,
    check_sinks: bool = True,
    open_location: Callable[[str], Storage] = open_storage,
    kafka: KafkaSettings | None = None,
    accept_source_gap: bool = False,
    check_sources: bool = True,
) -> RestorePlan:
    """Check everything and return what a restore would do; nothing is written. A sink that committed
    batches beyond the snapshot is refused (see sinks/) unless `rewind_sink`: then the plan also moves the
    sink back to the snapshot's batch. `check_sinks=False` for throwaway copies that write no sink (deep
    verify, the pre-flight's noop sink). Kafka positions whose records the broker (`kafka`) no longer holds
    are refused (source_guard.py) unless `accept_source_gap`; `check_sources=False` only for copies that
    never read a source (deep verify)."""
    manifest = store.get(job, snapshot_id)
    if manifest.status is not SnapshotStatus.COMPLETED:
        detail = f": {manifest.error}" if manifest.error else ""
        raise Refused(
            f"snapshot {manifest.id} of job {job} is {manifest.status}{detail}; nothing was restored. "
            f"Pick a COMPLETED one with `savepoints list --job {job}`"
        )
    existing = next(iter(target.list()), None)
    if existing is not None:
        raise Refused(
            f"restore target {target.uri} is not empty (it holds {existing.key}): restore into a new, empty "
            "location; nothing was written"
        )
    plan = RestorePlan(manifest, target, [])
    rewritten = {f.path for f in manifest.files if _ABSOLUTE_PATH_FILE.match(f.path)}
    for entry in manifest.files:
        parent = entry.path.removesuffix(".crc")
        if entry.path.startswith(SINK_LOGS):
            continue  # kept for rewinding a sink, not part of the checkpoint
        if entry.path.endswith(".crc") and parent in rewritten:
            plan.dropped.append(entry.path)
        else:
            plan.files.append(entry)
    plan.rewrites = sorted(rewritten)
    plan.spark_conf = {**manifest.spark_conf, **manifest.restore_conf}
    plan.warnings.append(
        f"the restored query keeps query id {manifest.query_id}: stop the original query before starting it, "
        "and never let both write the same sink"
    )
    if check_sources:
        plan.sources = source_guard.guard(store, manifest, kafka, accept_gap=accept_source_gap)
        plan.warnings += plan.sources.warnings()
    if check_sinks:
        _guard_sinks(store, plan, rewind_sink, open_location)
    return plan


def sink_bound(manifest: Manifest) -> int | None:
    """The last batch a sink may have committed for a restore of `manifest` to be safe. A stateful query
    must re-run every batch after N: a batch the sink skips never writes its state version, and the next
    batch fails to load it. A stateless one may find its pending batch N+1 committed (it is replayed with
    the same offsets, so skipping it loses nothing)."""
    if manifest.operators or manifest.pending_batch_id is None:
        return manifest.batch_id
    return manifest.pending_batch_id


def _guard_sinks(
    store: SnapshotStore, plan: RestorePlan, rewind: bool, open_location: Callable[[str], Storage]
) -> None:
    manifest = plan.manifest
    bound = sink_bound(manifest)
    for index, sink in enumerate(manifest.sinks):
        kind, location = sink.get("kind", FILE), sink["location"]
        if kind not in GUARDED:
            plan.warnings.append(f"sink {location} is not guarded (only {', '.join(GUARDED)} sinks are checked)")
            continue
        output = open_location(location)
        position = file_sink.position(output)
        if position is None or bound is None or position <= bound:
            continue
        skipped = f"{bound + 1}..{position}" if position > bound + 1 else str(position)
        if not rewind:
            consequence = (
                "their state is never written, so the restored query fails on its first new batch"
                if manifest.operators
                else "their new records would be lost"
            )
            raise Refused(
                f"file sink {location} has committed batch {position}, beyond batch {bound} of snapshot "
                f"{manifest.id}: a restore would skip batches {skipped} as already written ({consequence}). "
                "Rewind the sink with --rewind-sink (its output after batch "
                f"{bound} is moved aside into {location.rstrip('/')}/{file_sink.QUARANTINE} and written again), "
                "or restore a newer snapshot; nothing was written"
            )
        saved = _saved_sink_log(store, manifest, index)
        rewind_plan = file_sink.plan_rewind(output, saved, bound, manifest.id)
        plan.rewinds.append((output, rewind_plan))
        plan.warnings.append(
            f"file sink {location} is rewound to batch {bound}: batches {skipped} "
            f"({len(rewind_plan.data)} data files) move to {rewind_plan.describe()['quarantine']} and run again"
        )


def _saved_sink_log(store: SnapshotStore, manifest: Manifest, index: int) -> dict[str, bytes] | None:
    """The sink's log files as the snapshot kept them (none in snapshots taken before sinks were recorded)."""
    prefix = sink_log_prefix(index) + file_sink.LOG_DIR
    kept = [entry for entry in manifest.files if entry.path.startswith(prefix)]
    if not kept:
        return None
    saved = {}
    for entry in kept:
        data = store.storage.read(entry.blob)
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise IntegrityError(
                f"snapshot {manifest.id}: its copy of {entry.path} does not match its checksum; run `savepoints verify`"
            )
        saved[entry.path[len(prefix) :]] = data
    return saved


def execute_restore(
    store: SnapshotStore,
    plan: RestorePlan,
    *,
    progress: Progress | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> dict[str, Any]:
    progress = progress or NullProgress()
    target = plan.target
    root = spark_uri(target)
    written: list[str] = []

    def restore_one(entry: FileEntry) -> None:
        destination = target.local_path(entry.path)
        local = _scratch_file(destination)
        written.append(entry.path)  # before the write: a failure mid-write is cleaned up too
        try:
            try:
                store.storage.download(entry.blob, local, size=entry.size)
            except FileNotFoundError:
                raise IntegrityError(
                    f"snapshot {plan.manifest.id}: stored content of {entry.path} ({entry.blob}) is missing; "
                    "restore another snapshot"
                ) from None
            digest = sha256_file(local)
            if digest.sha256 != entry.sha256 or digest.size != entry.size:
                raise IntegrityError(
                    f"snapshot {plan.manifest.id}: {entry.path} does not match its checksum (stored content "
                    f"{entry.blob} is corrupt); restore another snapshot and run `savepoints verify`"
                )
            if entry.path in plan.rewrites:
                text = local.read_text()
                local.write_text(_SCHEMA_PATH.sub(lambda m: f'"{root}{m.group(2)}"', text))
            if destination is not None:
                local.replace(destination)  # same directory: an atomic rename, no second copy
            else:
                target.upload(local, entry.path)
        finally:
            local.unlink(missing_ok=True)
        progress.advance(entry.size)

    started = time.monotonic()
    for output, rewind in plan.rewinds:  # first: the sink is back at batch N before anything can run on N
        file_sink.execute(output, rewind)
    # commits/ last: until the commit exists, Spark does not take the location for a restorable batch
    first = [f for f in plan.files if not f.path.startswith("commits/")]
    last = [f for f in plan.files if f.path.startswith("commits/")]
    progress.start(f"restore {plan.manifest.id} -> {target.uri}", plan.total_bytes, len(plan.files))
    try:
        for batch in (first, last):
            for _ in run_parallel(restore_one, batch, concurrency=concurrency):
                pass
    except BaseException:
        target.delete(written)
        raise
    finally:
        progress.finish()
    if (gap := plan.source_gap) is not None:
        source_guard.record_gap(store, plan.manifest, gap)
    return {**plan.describe(), "seconds": round(time.monotonic() - started, 3)}


def _scratch_file(destination: Path | None) -> Path:
    """Where a file is downloaded and checked: beside its destination (so the final move is a rename,
    and Spark ignores the dot-name meanwhile), or in the system temp directory for remote targets."""
    directory = destination.parent if destination is not None else Path(tempfile.gettempdir())
    directory.mkdir(parents=True, exist_ok=True)
    name = destination.name if destination is not None else "restore"
    return directory / f".{name}.{secrets.token_hex(8)}.tmp"
