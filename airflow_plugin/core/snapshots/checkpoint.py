"""Reads a Spark Structured Streaming checkpoint and works out the exact file set that restarts the query
at its latest committed batch N (docs/spark-checkpoints.md section 2), from what is on disk.

Order matters with a live query: `commits/` is listed first and N decided from it; everything else is
listed afterwards. Spark writes a batch's offsets and state before its commit, so whatever commit we
saw has its files in the later listings, unless cleanup deleted them meanwhile (caught by the copy)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..compactible_log import log_id
from ..errors import CheckpointError, NotFound
from ..guards.sink import start_bound
from ..parallel import DEFAULT_CONCURRENCY, run_parallel
from ..sources import offsets_by_source
from ..sources.files import log_offset
from ..storage import ObjectInfo, Storage
from .state_files import files_for_version

# a file's identity as a listing shows it, the one by which a create reuses what an earlier snapshot knew of it:
# (key, size, mtime)
Identity = tuple[str, int, float]

_BATCH = re.compile(r"^\d+$")
PARTITION_META = "_metadata"
OPERATOR_META = ("_metadata", "_stateSchema")
STORE_SUBDIRS = ("SSTs", "logs")

# Confs that offsets/N does not pin but a restored query must set the same way (section 1).
FORMAT_VERSION_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def is_transient(name: str) -> bool:
    """Hadoop local-FS checksums (.x.crc) and in-flight temp files (.x.uuid.tmp) are never copied."""
    return name.startswith(".") or name.endswith(".tmp")


@dataclass
class StateStoreDir:
    operator: int
    partition: int
    name: str  # "default" or a named store (stream-stream joins)
    prefix: str  # key prefix of the directory, ending with '/'


@dataclass
class RestartPoint:
    """Everything a snapshot needs to know about one checkpoint at its latest committed batch."""

    location: str
    query_id: str
    batch_id: int
    pending_batch_id: int | None
    files: list[ObjectInfo]
    watermark_ms: int | None = None
    batch_timestamp_ms: int | None = None
    source_offsets: list[str] = field(default_factory=list)
    offsets_version: int = 1  # the offsets log's version: how `source_offsets` are laid out (sources/)
    spark_conf: dict[str, str] = field(default_factory=dict)
    restore_conf: dict[str, str] = field(default_factory=dict)
    operators: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _batches(infos: Iterable[ObjectInfo], directory: str) -> dict[int, ObjectInfo]:
    result = {}
    for info in infos:
        name = info.key[len(directory) + 1 :]
        if _BATCH.match(name):
            result[int(name)] = info
    return result


def _parse_log(raw: bytes, where: str) -> tuple[str, list[str]]:
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if not lines or not re.match(r"^v\d+$", lines[0]):
        raise CheckpointError(f"{where} is not a Spark log file (first line {lines[0][:20]!r})")
    return lines[0], lines[1:]


def _offsets(raw: bytes, where: str) -> tuple[int, dict[str, Any], list[str]]:
    """The log's version, its metadata and its source lines (laid out by the version: sources/)."""
    version, rest = _parse_log(raw, where)
    try:
        meta = json.loads(rest[0]) if rest else {}
    except json.JSONDecodeError:
        raise CheckpointError(f"{where} has unreadable offset metadata") from None
    return int(version[1:]), meta, [line for line in rest[1:] if line != ""]


def _commit(raw: bytes, where: str) -> tuple[int, dict[str, Any]]:
    version, rest = _parse_log(raw, where)
    try:
        return int(version[1:]), (json.loads(rest[0]) if rest and rest[0] else {})
    except json.JSONDecodeError:
        raise CheckpointError(f"{where} has an unreadable commit entry") from None


def store_of(key: str) -> StateStoreDir | None:
    """The store directory a state file belongs to: `state/<op>/<p>/` (default store, with its SSTs/ and
    logs/) or `state/<op>/<p>/<name>/` (named stores of stream-stream joins). None for metadata."""
    parts = key.split("/")  # state/<op>/<p>/...
    if len(parts) < 4 or not parts[1].isdigit() or not parts[2].isdigit() or PARTITION_META in parts[3:]:
        return None
    if len(parts) == 4 or parts[3] in STORE_SUBDIRS:
        return StateStoreDir(int(parts[1]), int(parts[2]), "default", "/".join(parts[:3]) + "/")
    return StateStoreDir(int(parts[1]), int(parts[2]), parts[3], "/".join(parts[:4]) + "/")


def _is_state_metadata(key: str) -> bool:
    """Operator metadata (`state/<op>/_metadata/**`, `state/<op>/_stateSchema/**`) and the schema of
    each partition or named store (`state/<op>/<p>/[<store>/]_metadata/**`)."""
    parts = key.split("/")
    return (
        len(parts) >= 4
        and parts[1].isdigit()
        and (parts[2] in OPERATOR_META or (parts[2].isdigit() and PARTITION_META in parts[3:-1]))
    )


def _operator_info(storage: Storage, metadata: list[ObjectInfo]) -> list[dict[str, Any]]:
    """Operator id, name and stores from `state/<op>/_metadata/metadata` (operator metadata v1)."""
    operators = []
    for info in metadata:
        parts = info.key.split("/")
        if parts[2:] != ["_metadata", "metadata"]:
            continue
        entry: dict[str, Any] = {"id": int(parts[1])}
        try:
            for line in storage.read(info.key).decode().splitlines()[1:]:
                data = json.loads(line)
                op = data.get("operatorInfo", {})
                entry["name"] = op.get("operatorName")
                entry["stores"] = [
                    {"name": s.get("storeName"), "partitions": s.get("numPartitions")}
                    for s in data.get("stateStoreInfo", [])
                ]
        except (ValueError, FileNotFoundError):
            entry["name"] = None
        operators.append(entry)
    return sorted(operators, key=lambda e: e["id"])


@dataclass(frozen=True)
class Position:
    """Where a query resumes on a checkpoint, read cheaply (its commits, offsets and id; no state file): what
    the job runtime checks its sink against before it starts the query."""

    query_id: str
    last_committed: int | None  # None: nothing committed yet
    pending: int | None  # offsets logged without a commit: replayed with the same offsets
    stateful: bool
    # when each logged batch was planned (its offsets file's mtime, epoch seconds), and -1: when the query began
    # (its `metadata`): a sink's commits of batches after N were all made later than batch N's planning
    planned: dict[int, float] = field(default_factory=dict)

    def planned_ms(self, batch: int) -> int | None:
        """When `batch` was planned (-1: when the query began), epoch ms; None where it is no longer logged."""
        seconds = self.planned.get(max(batch, -1))
        return None if seconds is None else int(seconds * 1000)

    @property
    def next_batch(self) -> int:
        if self.pending is not None:
            return self.pending
        return 0 if self.last_committed is None else self.last_committed + 1

    @property
    def sink_bound(self) -> int:
        return start_bound(self.last_committed, self.pending, self.stateful)


def read_position(storage: Storage) -> Position | None:
    """The position of the checkpoint at `storage`; None where Spark would start fresh (no `metadata`)."""
    began = storage.stat("metadata")
    if began is None:
        return None
    try:
        query_id = str(json.loads(storage.read("metadata")).get("id", ""))
    except (ValueError, AttributeError):
        raise CheckpointError(f"{storage.uri}/metadata is not Spark checkpoint metadata JSON") from None
    commits = _batches(storage.list("commits/"), "commits")
    offsets = _batches(storage.list("offsets/"), "offsets")
    committed = [b for b in commits if b in offsets]
    last = max(committed) if committed else None
    after = -1 if last is None else last
    pending = after + 1 if (after + 1) in offsets and (after + 1) not in commits else None
    stateful = next(iter(storage.list("state/")), None) is not None
    planned = {-1: began.mtime, **{batch: info.mtime for batch, info in offsets.items()}}
    return Position(query_id, last, pending, stateful, planned)


@dataclass(frozen=True)
class LoggedBatch:
    """One entry of a checkpoint's offset log: batch N's end positions and the watermark it ran with."""

    batch_id: int
    watermark_ms: int
    offsets_version: int
    source_offsets: list[str]


class OffsetLog:
    """A checkpoint's offset log (`offsets/`), read one batch at a time on demand: Spark keeps the newest
    `spark.sql.streaming.minBatchesToRetain` (100) of them, and a replay's start needs only a few."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.batch_ids = sorted(_batches(storage.list("offsets/"), "offsets"))

    def read(self, batch_id: int) -> LoggedBatch:
        where = f"{self.storage.uri}/offsets/{batch_id}"
        try:
            version, meta, lines = _offsets(self.storage.read(f"offsets/{batch_id}"), where)
        except FileNotFoundError:
            raise CheckpointError(f"{where} is gone (the query's cleanup deleted it meanwhile): try again") from None
        return LoggedBatch(batch_id, int(meta.get("batchWatermarkMs") or 0), version, lines)

    def initial_offsets(self, source: str) -> str | None:
        """The Kafka position a source started the query at (`sources/<id>/0`), or None where there is none."""
        try:
            raw = self.storage.read(f"sources/{source}/0")
        except FileNotFoundError:
            return None
        return parse_kafka_initial_offsets(raw)


# Spark's Kafka source records the positions a fresh query starts at in `sources/<id>/0` (its
# KafkaSourceInitialOffsetWriter): a zero byte (SPARK-19517), "v1", a newline, the offset JSON
KAFKA_INITIAL_OFFSETS_PREFIX = b"\x00v1\n"


def parse_kafka_initial_offsets(raw: bytes) -> str | None:
    text = raw.removeprefix(b"\x00")
    if not text.startswith(b"v1\n"):
        return None
    return text[3:].decode().strip() or None


def kafka_initial_offsets(offset_json: str) -> bytes:
    """What `sources/<id>/0` holds for a Kafka source starting at `offset_json`."""
    return KAFKA_INITIAL_OFFSETS_PREFIX + offset_json.encode()


def read_restart_point(
    storage: Storage, zips: Mapping[Identity, Sequence[tuple[str, int]]] | None = None
) -> RestartPoint:
    """Decide N and the exact files that restart the query at N. Raises CheckpointError for anything that
    is not a usable checkpoint, and CheckpointChanged when a needed file is already gone. `zips`: what RocksDB
    zips an earlier snapshot of this checkpoint held list (`zip_listings`), so that only new zips are read."""
    where = storage.uri
    commit_files = list(storage.list("commits/"))  # first: N is decided from what is committed
    commits = _batches(commit_files, "commits")
    meta_info = storage.stat("metadata")
    if meta_info is None:
        if not storage.exists():
            raise NotFound(f"checkpoint location {where} does not exist or is empty: check the path")
        raise CheckpointError(
            f"{where} is not a Spark checkpoint (no 'metadata' file): point --checkpoint at the directory "
            "given to writeStream.option('checkpointLocation')"
        )
    offset_files = list(storage.list("offsets/"))
    offsets = _batches(offset_files, "offsets")
    committed = [b for b in commits if b in offsets]
    if not committed:
        raise CheckpointError(
            f"checkpoint {where} has no committed batch yet: let the query commit its first batch, then retry"
        )
    n = max(committed)
    pending = n + 1 if (n + 1) in offsets and (n + 1) not in commits else None
    earlier = [b for b in offsets if b < n]
    previous = max(earlier) if earlier else None  # N-1, or the one before a gap (async progress tracking)
    try:
        query_id = json.loads(storage.read("metadata")).get("id", "")
    except (ValueError, AttributeError):
        raise CheckpointError(f"{where}/metadata is not Spark checkpoint metadata JSON") from None

    offsets_version, offset_meta, source_lines = _offsets(storage.read(offsets[n].key), f"{where}/{offsets[n].key}")
    last_kept = offsets_by_source(offsets_version, source_lines, f"{where}/{offsets[n].key}")
    if pending is not None:
        pending_where = f"{where}/{offsets[pending].key}"
        pending_version, _, pending_lines = _offsets(storage.read(offsets[pending].key), pending_where)
        last_kept = offsets_by_source(pending_version, pending_lines, pending_where)
    format_version, commit = _commit(storage.read(commits[n].key), f"{where}/{commits[n].key}")

    selected = [meta_info, commits[n], offsets[n]]
    selected += [offsets[b] for b in (previous, pending) if b is not None]
    selected += _source_logs(storage, last_kept)
    state = [i for i in storage.list("state/") if not is_transient(i.key.rsplit("/", 1)[-1])]
    unique_ids = commit.get("stateUniqueIds") or {}
    state_files, uses_changelog = _state_files(storage, state, n + 1, unique_ids, zips or {})
    metadata = [info for info in state if _is_state_metadata(info.key)]
    operators = _operator_info(storage, metadata)
    _check_state_complete(where, n, operators, state)
    selected += state_files + _operator_metadata(metadata, pending if pending is not None else n)
    selected = _with_companion_checksums(selected, [*state, *offset_files, *commit_files])

    restore_conf = {}
    if format_version >= 2:
        restore_conf[FORMAT_VERSION_CONF] = str(format_version)
    if uses_changelog:
        restore_conf[CHANGELOG_CONF] = "true"
    return RestartPoint(
        location=where,
        query_id=str(query_id),
        batch_id=n,
        pending_batch_id=pending,
        files=selected,
        watermark_ms=offset_meta.get("batchWatermarkMs"),
        batch_timestamp_ms=offset_meta.get("batchTimestampMs"),
        source_offsets=source_lines,
        offsets_version=offsets_version,
        spark_conf={str(k): str(v) for k, v in (offset_meta.get("conf") or {}).items()},
        restore_conf=restore_conf,
        operators=operators,
    )


def _check_state_complete(where: str, batch_id: int, operators: list[dict[str, Any]], state: list[ObjectInfo]) -> None:
    """Every state store the operators' metadata declares (per partition) has files: each commit writes a
    version in every one. A store with none at all after a committed batch was never run: the query
    committed batches its sink skipped as already written (docs/spark-checkpoints.md section 6), and a copy
    of it could never be restored."""
    present = {(s.operator, s.partition, s.name) for info in state if (s := store_of(info.key)) is not None}
    missing = []
    for operator in operators:
        for store in operator.get("stores") or []:
            name, partitions = store.get("name"), store.get("partitions")
            if not isinstance(name, str) or not isinstance(partitions, int):
                continue
            absent = [p for p in range(partitions) if (operator["id"], p, name) not in present]
            if absent:
                shown = f"{absent[0]}..{absent[-1]}" if len(absent) > 1 else str(absent[0])
                missing.append(f"operator {operator['id']} store {name} partitions {shown}")
    if missing:
        raise CheckpointError(
            f"checkpoint {where} has committed batch {batch_id}, but its state has no files at all for "
            f"{'; '.join(missing)}: the state is incomplete. A sink that skipped batches as already written "
            "leaves exactly this (the query committed them without running them, so no state was written), and "
            "a snapshot of it could not be restored. See docs/operations.md, 'A sink that skips batches'"
        )


def _source_logs(storage: Storage, last_kept: dict[str, str]) -> list[ObjectInfo]:
    """All of `sources/<id>/`, except that a file source's log stops at the logOffset of the last kept
    offsets file (its position by source id): an entry beyond it would make Spark skip files it never processed."""
    selected = []
    bounds = {source: log_offset(line) for source, line in last_kept.items()}  # once, not once per log file
    for info in storage.list("sources/"):
        parts = info.key.split("/")
        if len(parts) < 3 or is_transient(parts[-1]):
            continue
        bound = bounds.get(parts[1])
        logged = log_id(parts[-1])
        if bound is not None and logged and len(parts) == 3 and logged[0] > bound:
            continue
        selected.append(info)
    return selected


def _state_files(
    storage: Storage,
    state: list[ObjectInfo],
    version: int,
    unique_ids: dict[str, Any],
    zips: Mapping[Identity, Sequence[tuple[str, int]]],
) -> tuple[list[ObjectInfo], bool]:
    """Per store directory, the files that rebuild `version`; and whether changelog checkpointing is on."""
    stores: dict[str, StateStoreDir] = {}
    by_store: dict[str, dict[str, ObjectInfo]] = defaultdict(dict)
    for info in state:
        store = store_of(info.key)
        if store is not None:
            stores.setdefault(store.prefix, store)
            by_store[store.prefix][info.key[len(store.prefix) :]] = info

    def needed(prefix: str) -> list[ObjectInfo]:
        listing = by_store[prefix]
        known = {name: zips[identity] for name, info in listing.items() if (identity := _identity(info)) in zips}
        names = files_for_version(
            {name: info.size for name, info in listing.items()},
            version,
            lambda name: storage.read(prefix + name),
            _unique_id(unique_ids, stores[prefix], stores),
            known,
        )
        return [listing[name] for name in names]

    # in parallel: each RocksDB store's newest zip is read for the SST files it names, one request each, and at
    # Spark's default 200 partitions one after the other they were most of a snapshot's planning (11 s of 12 s
    # at 5 GB of state on a disk-backed S3 server); a zip an earlier snapshot held is not read again (`zips`)
    found = run_parallel(needed, sorted(stores), concurrency=DEFAULT_CONCURRENCY)
    selected = sorted((info for files in found for info in files), key=lambda info: info.key)
    uses_changelog = any(name.endswith(".changelog") for listing in by_store.values() for name in listing)
    return selected, uses_changelog


def _identity(info: ObjectInfo) -> Identity:
    return (info.key, info.size, info.mtime)


def zip_listings(files: Iterable[Identity]) -> dict[Identity, list[tuple[str, int]]]:
    """What each RocksDB zip in one earlier snapshot of a checkpoint lists, from that snapshot's files alone: a
    snapshot holds one zip per store, the
    base of its state, and beside it exactly the SST and log files that zip lists (`files_for_version`), each
    checked against the zip's sizes when it was taken. The same zip (key, size, mtime: the identity by which
    a create reuses a file's content without reading it) lists the same files again."""
    by_store: dict[str, dict[str, Identity]] = defaultdict(dict)
    for identity in files:
        key = identity[0]
        store = store_of(key) if key.startswith("state/") else None
        if store is not None:
            by_store[store.prefix][key[len(store.prefix) :]] = identity
    listings = {}
    for names in by_store.values():
        bases = [identity for name, identity in names.items() if "/" not in name and name.endswith(".zip")]
        if len(bases) != 1:
            continue  # no zip (changelogs from 1), or not a snapshot's one base: read the zip
        listings[bases[0]] = sorted(
            (name, identity[1])
            for name, identity in names.items()
            if name.split("/", 1)[0] in STORE_SUBDIRS and not (name.endswith(".crc") and name[:-4] in names)
        )
    return listings


def _operator_metadata(metadata: list[ObjectInfo], last_batch: int) -> list[ObjectInfo]:
    """Operator metadata and schemas; operator metadata v2 is per batch, and a file written after the
    last kept batch describes a plan that is not restored."""
    kept = []
    for info in metadata:
        parts = info.key.split("/")
        if parts[2:4] == ["_metadata", "v2"] and _BATCH.match(parts[-1]) and int(parts[-1]) > last_batch:
            continue
        kept.append(info)
    return kept


def _unique_id(unique_ids: dict[str, Any], store: StateStoreDir, stores: dict[str, StateStoreDir]) -> str | None:
    """Format v2: commits/N holds per operator, per partition, per store the unique id of version N+1."""
    per_partition = unique_ids.get(str(store.operator))
    if not per_partition or store.partition >= len(per_partition):
        return None
    ids = per_partition[store.partition]
    names = sorted(s.name for s in stores.values() if s.operator == store.operator and s.partition == store.partition)
    index = names.index(store.name) if len(ids) == len(names) else 0
    return ids[index] if ids else None


def _with_companion_checksums(selected: list[ObjectInfo], listed: list[ObjectInfo]) -> list[ObjectInfo]:
    """Spark 4.1+ writes `<name>.crc` JSON checksums beside some files: keep them with their file."""
    known = {info.key: info for info in listed}
    keys = {info.key for info in selected}
    extra = [known[k + ".crc"] for k in keys if k + ".crc" in known and k + ".crc" not in keys]
    unique = {info.key: info for info in [*selected, *extra]}
    return sorted(unique.values(), key=lambda info: info.key)
