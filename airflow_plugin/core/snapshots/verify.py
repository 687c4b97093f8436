"""Verify a snapshot: every stored file against its checksum (packed files by their byte ranges, each
pack read with as few requests as its layout allows); `deep` also restores it into a scratch location and
has Spark read every operator's state at batch N (a separate Spark application,
spark_jobs/tools/state_check.py), comparing rows with the original checkpoint while it still holds N."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Refused
from ..parallel import DEFAULT_CONCURRENCY, run_parallel
from ..progress import NullProgress, Progress
from ..records.manifest import FileEntry, Manifest, SnapshotStatus
from ..spark_app import run_spark_tool
from ..storage import open_storage, sha256_file, spark_uri
from ..timestamps import utc_now
from .blobs import IN_MEMORY, checksum_problem
from .restore import restore_scratch
from .store import SnapshotStore


@dataclass
class VerifyReport:
    snapshot: str
    job: str
    batch_id: int | None
    files: int
    bytes: int
    problems: list[str] = field(default_factory=list)
    deep: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def verify_snapshot(
    store: SnapshotStore,
    job: str,
    snapshot_id: str,
    *,
    deep: bool = False,
    progress: Progress | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    spark_conf: dict[str, str] | None = None,
) -> VerifyReport:
    """Check every stored file against its checksum; `deep`: Spark also reads the state of a restored copy
    and compares it with the original checkpoint's, with `spark_conf` (the job's: S3A for an original on
    s3a://, context.py `JobContext.spark_conf`)."""
    manifest = store.get(job, snapshot_id)
    if manifest.status is not SnapshotStatus.COMPLETED:
        raise Refused(
            f"snapshot {manifest.id} of job {job} is {manifest.status}: only COMPLETED snapshots can be verified; "
            f"see `savepoints list {job}`"
        )
    progress = progress or NullProgress()
    started = time.monotonic()
    report = VerifyReport(manifest.id, job, manifest.batch_id, len(manifest.files), manifest.total_bytes)

    def check(entry: FileEntry, data: bytes | None) -> str | None:
        progress.advance(entry.size)
        return checksum_problem(entry, data)

    def check_large(entry: FileEntry) -> str | None:
        try:
            with store.storage.fetched(entry.key) as local:
                digest = sha256_file(local)
        except FileNotFoundError:
            return check(entry, None)
        progress.advance(entry.size)
        if digest.size != entry.size or digest.sha256 != entry.sha256:
            return f"{entry.path}: checksum mismatch (stored content {entry.key} {entry.byte_range} is corrupt)"
        return None

    small = [f for f in manifest.files if f.size <= IN_MEMORY]
    large = [f for f in manifest.files if f.size > IN_MEMORY]
    progress.start(f"verify {manifest.id}", manifest.total_bytes, len(manifest.files))
    try:
        problems = list(store.blobs.read_each(small, check, concurrency=concurrency))
        problems += run_parallel(check_large, large, concurrency=concurrency)
        report.problems = sorted(p for p in problems if p)
    finally:
        progress.finish()
    if deep and report.ok:
        report.deep = _deep(store, job, manifest, concurrency, spark_conf or {})
        report.problems.extend(report.deep.get("problems", []))
    report.seconds = round(time.monotonic() - started, 3)
    # only the verdict is written, on the manifest as it is now: a repack may have moved contents meanwhile
    verdict = {"ok": report.ok, "deep": deep, "at": utc_now(), "problems": report.problems[:20]}
    store.update(job, manifest.id, lambda current: setattr(current, "verification", verdict))
    return report


def _deep(
    store: SnapshotStore, job: str, manifest: Manifest, concurrency: int, spark_conf: dict[str, str]
) -> dict[str, Any]:
    snapshot_id, batch_id, original = manifest.id, manifest.batch_id, manifest.source
    with tempfile.TemporaryDirectory(prefix="savepoints-deep-") as tmp:
        scratch = Path(tmp) / "checkpoint"  # a scratch copy that Spark only reads: no sink written, no source read
        plan = restore_scratch(store, job, snapshot_id, scratch, concurrency=concurrency)
        result_file = Path(tmp) / "result.json"
        args = ["--checkpoint", str(scratch), "--batch", str(batch_id), "--out", str(result_file)]
        if original:  # as Spark spells it: s3a:// for a checkpoint the engine recorded as s3://
            args += ["--original", spark_uri(open_storage(original))]
        run_spark_tool("state_check", args, conf={**spark_conf, **plan.spark_conf})
        return json.loads(result_file.read_text())
