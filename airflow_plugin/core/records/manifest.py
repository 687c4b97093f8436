"""The snapshot manifest: what a snapshot is, as data. Written as JSON; the manifest with status
COMPLETED is the commit of a snapshot (it is written last)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from ..errors import CheckpointError, IntegrityError, InvalidInput
from ..guards.sink import start_bound
from ..layout import blob_key, check_name, is_stored_content
from ..sources import SourcePosition, positions
from ..storage import check_key
from ..timestamps import stamped_id

# files as [path, size, sha256, mtime, key, offset]: the store object holding the content and where in it (a
# pack holds many small files; a large file is one object at offset 0). The store's own format: blobs.py.
FORMAT_VERSION = 2
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class SnapshotStatus(StrEnum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class Kind(StrEnum):
    SAVEPOINT = "savepoint"
    CHECKPOINT = "checkpoint"


class Trigger(StrEnum):
    MANUAL = "MANUAL"
    UI = "UI"
    PERIODIC = "PERIODIC"
    UPGRADE = "UPGRADE"
    STOP = "STOP"


MAX_LABEL_VALUE = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def parse_labels(value: Mapping[str, object] | Iterable[str] | str | None) -> dict[str, str]:
    """Labels as the CLI (`--label K=V`, repeatable), a DAG form (one `K=V` text, maybe empty) and the
    operators (a dict) give them, checked once: keys are names, values one line of at most 256 characters.
    Any other text (quotes, `<script>`) is kept as written: whoever shows a label renders it as text."""
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        pairs = [(str(k), v if isinstance(v, str) else str(v)) for k, v in value.items()]
    else:
        pairs = []
        for item in [value] if isinstance(value, str) else value:
            key, sep, text = str(item).partition("=")
            if not sep or not key:
                raise InvalidInput(f"invalid label {str(item)[:80]!r}: use KEY=VALUE (e.g. reason=upgrade)")
            pairs.append((key, text))
    labels = {}
    for key, text in pairs:
        check_name(key, "label key")
        if _CONTROL.search(text):
            raise InvalidInput(f"invalid value of label {key!r}: a line break or control character; use one line")
        if len(text) > MAX_LABEL_VALUE:
            raise InvalidInput(f"invalid value of label {key!r}: {len(text)} characters; use at most {MAX_LABEL_VALUE}")
        labels[key] = text
    return labels


def new_snapshot_id(kind: Kind, now: datetime | None = None) -> str:
    """Sortable by time (UTC, milliseconds), unique by a random suffix: sp-20261121T055614123Z-3f9a."""
    return stamped_id("sp" if kind is Kind.SAVEPOINT else "ck", now)


SINK_LOGS = "_savepoints/sinks/"  # manifest paths of sink logs kept with a snapshot; never restored into a checkpoint


def sink_log_prefix(index: int) -> str:
    return f"{SINK_LOGS}{index}/"


IN_FLIGHT_SECONDS = 6 * 3600  # an IN_PROGRESS snapshot older than this was abandoned (a crash), not running


def in_flight(snapshot: Listed, now: datetime, abandoned_after_s: float = IN_FLIGHT_SECONDS) -> bool:
    """The one in-flight rule: IN_PROGRESS and younger than the abandonment threshold. A create writes its
    IN_PROGRESS manifest before it reads what the store holds, so while one is in flight no deletion may
    remove contents it could be about to reuse."""
    created = datetime.fromisoformat(snapshot.created_at.replace("Z", "+00:00"))
    return snapshot.status is SnapshotStatus.IN_PROGRESS and (now - created).total_seconds() < abandoned_after_s


def _file_entry(item: list[Any]) -> FileEntry:
    path, size, sha, mtime, key, offset = item
    check_key(path)
    if not isinstance(size, int) or size < 0 or not _SHA256.match(str(sha)):
        raise ValueError(f"bad file entry {item!r}")
    if not isinstance(key, str) or not is_stored_content(check_key(key)) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"bad stored location in file entry {item!r}")
    return FileEntry(path, size, sha, float(mtime), key, offset)


@dataclass(slots=True)
class FileEntry:
    path: str  # relative to the checkpoint root
    size: int
    sha256: str
    mtime: float = 0.0  # of the source file; lets the next snapshot of the same location skip re-hashing
    key: str = ""  # the store object holding the content: a pack, or the content's own blob ("": its blob)
    offset: int = 0  # where the content starts in that object; it is `size` bytes long

    def __post_init__(self) -> None:
        if not self.key:
            self.key = blob_key(self.sha256)

    @property
    def span(self) -> tuple[int, int]:
        """Which content of its object it is: offset and size. The offset alone does not tell: an empty content
        has the offset of the one written after it."""
        return (self.offset, self.size)

    @property
    def byte_range(self) -> str:
        """The HTTP Range of the content in its object (what `aws s3api get-object --range` takes)."""
        return f"bytes={self.offset}-{self.offset + self.size - 1}"


@dataclass(slots=True)
class Manifest:
    id: str
    job: str
    kind: Kind
    trigger: Trigger
    status: SnapshotStatus
    source: str  # the checkpoint location the snapshot was taken from
    created_at: str
    requested_by: str = ""
    request_id: str | None = None  # the request that made it: its retries find it (context.py Settings)
    deployment: str | None = None
    job_version: str | None = None
    completed_at: str | None = None
    query_id: str | None = None
    batch_id: int | None = None
    pending_batch_id: int | None = None  # offsets/N+1 kept without a commit: replayed exactly on restore
    watermark_ms: int | None = None
    batch_timestamp_ms: int | None = None
    source_offsets: list[str] = field(default_factory=list)  # one line per source, as in offsets/N
    offsets_version: int = 1  # offsets/N's version line: how source_offsets are laid out (sources/)
    spark_conf: dict[str, str] = field(default_factory=dict)  # pinned by Spark in offsets/N
    restore_conf: dict[str, str] = field(default_factory=dict)  # a restored query must set these itself
    operators: list[dict[str, Any]] = field(default_factory=list)
    # per stateful operator: its state's size at N from the checkpoint's files, rows from the query's progress,
    # and the skew over its partitions (state_stats.py): what the page charts without Spark
    state: list[dict[str, Any]] = field(default_factory=list)
    # kind, location; a file sink also last_batch_id (when snapshotted) and log (the prefix of its log files);
    # a Delta table also last_batch_id (of the query) and version (the table version at the sink bound)
    sinks: list[dict[str, Any]] = field(default_factory=list)
    # a deployment whose writes the runtime gates (a blue/green upgrade's): its gate column and interval
    # ({"column", "after", "until"}, epoch ms) when it was taken; what a restore keeps of it: `restored_gate`
    gate: dict[str, Any] | None = None
    files: list[FileEntry] = field(default_factory=list)
    total_bytes: int = 0
    uploaded_bytes: int = 0
    uploaded_files: int = 0
    attempts: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    pinned: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    verification: dict[str, Any] | None = None
    error: str | None = None
    # what happened to the snapshot after it was taken, oldest first (e.g. a restore that accepted a source gap)
    history: list[dict[str, Any]] = field(default_factory=list)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "files"}
        data["format_version"] = FORMAT_VERSION
        data["files"] = [[f.path, f.size, f.sha256, f.mtime, f.key, f.offset] for f in self.files]  # compact
        return json.dumps(data, separators=(",", ":"), sort_keys=False).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Manifest:
        """Parse and validate; anything malformed or unsafe is an IntegrityError naming `where`."""
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            version = data.get("format_version")
            if version != FORMAT_VERSION:
                raise ValueError(
                    f"format_version {version!r}, which this savepoints does not know (it reads {FORMAT_VERSION}): "
                    "a newer savepoints wrote it; upgrade savepoints"
                )
            files = [_file_entry(item) for item in data.pop("files", [])]
            manifest = cls(files=files, **data)
            manifest.kind = Kind(manifest.kind)
            manifest.trigger = Trigger(manifest.trigger)
            manifest.status = SnapshotStatus(manifest.status)
            check_name(manifest.job, "job name")
            manifest.source_positions()
        except InvalidInput as exc:
            raise IntegrityError(f"manifest {where} is unsafe: {exc}") from None
        except (ValueError, TypeError, KeyError, CheckpointError) as exc:
            raise IntegrityError(
                f"manifest {where} is corrupt ({exc}): delete the snapshot or restore the manifest from a backup"
            ) from None
        return manifest

    @property
    def sink_bound(self) -> int | None:
        """The last batch a sink may have committed for a restore of this snapshot to be safe. A stateful
        query must re-run every batch after N: a batch the sink skips never writes its state version, and
        the next batch fails to load it. A stateless one may find its pending batch N+1 committed (it is
        replayed with the same offsets, so skipping it loses nothing)."""
        if self.batch_id is None:
            return None
        return start_bound(self.batch_id, self.pending_batch_id, bool(self.operators))

    @property
    def restored_gate(self) -> dict[str, int] | None:
        """The gate interval a deployment restored from this snapshot writes: the lower bound `after` (a blue/green
        upgrade's new version writes only the windows ending after T; those up to T are the old version's, which
        wrote them), never the upper bound `until`: that was the old version's while it handed over, and a restore
        that kept it would silently write nothing after T once nobody else writes those windows."""
        after = (self.gate or {}).get("after")
        return None if after is None else {"after": int(after)}

    def gate_note(self) -> str | None:
        """What the snapshot's gate means for a restore, for a person (`show`)."""
        if not self.gate or (self.gate.get("after") is None and self.gate.get("until") is None):
            return None
        taken = ", ".join(f"{k} {_iso(v)}" for k, v in self.gate.items() if k in ("after", "until") and v is not None)
        kept = self.restored_gate
        restored = f"only the windows ending after {_iso(kept['after'])}" if kept else "every window"
        return f"taken while gated on {self.gate.get('column')} ({taken}); a restore writes {restored}"

    def source_positions(self) -> list[SourcePosition]:
        """Where each source stood at batch N: the next offsets to read (Kafka: per topic and partition)."""
        return positions(self.offsets_version, self.source_offsets, f"snapshot {self.id}")

    @property
    def file_count(self) -> int:
        return len(self.files)

    @property
    def verified(self) -> bool | None:
        return (self.verification or {}).get("ok")

    def summary(self) -> dict[str, Any]:
        """The machine-readable row the CLI prints (`--json`), without the file list."""
        return summary_of(self)

    def objects(self) -> dict[str, int]:
        """The store objects holding its contents, each with the bytes of its contents there (a content
        several files share counted once): what garbage collection and repacking need of it."""
        contents: dict[str, set[tuple[int, int]]] = {}
        for entry in self.files:
            contents.setdefault(entry.key, set()).add(entry.span)
        return {key: sum(size for _, size in held) for key, held in contents.items()}


class Listed(Protocol):
    """What a snapshot's row needs: a manifest has it, and so has its catalog entry (catalog/snapshots.py)."""

    id: str
    job: str
    kind: Kind
    trigger: Trigger
    status: SnapshotStatus
    batch_id: int | None
    created_at: str
    completed_at: str | None
    total_bytes: int
    uploaded_bytes: int
    pinned: bool
    labels: dict[str, str]
    source: str
    deployment: str | None
    error: str | None

    @property
    def file_count(self) -> int: ...

    @property
    def verified(self) -> bool | None: ...

    def source_positions(self) -> list[SourcePosition]: ...


def _iso(millis: int) -> str:
    return datetime.fromtimestamp(int(millis) / 1000, UTC).isoformat().replace("+00:00", "Z")


def summary_of(snapshot: Listed) -> dict[str, Any]:
    """The machine-readable row of a snapshot (`savepoints list --json`, XComs, the page), without files."""
    return {
        "id": snapshot.id,
        "job": snapshot.job,
        "kind": str(snapshot.kind),
        "trigger": str(snapshot.trigger),
        "status": str(snapshot.status),
        "batch_id": snapshot.batch_id,
        "created_at": snapshot.created_at,
        "completed_at": snapshot.completed_at,
        "files": snapshot.file_count,
        "bytes": snapshot.total_bytes,
        "uploaded_bytes": snapshot.uploaded_bytes,
        "pinned": snapshot.pinned,
        "labels": snapshot.labels,
        "source": snapshot.source,
        "deployment": snapshot.deployment,
        "verified": snapshot.verified,
        "error": snapshot.error,
        "source_positions": [p.to_dict() for p in snapshot.source_positions()],
    }
