"""A look inside a snapshot's state: `inspect` (per operator and store: schemas, rows, rows per partition and
skew, the oldest windowed key, a sample, one key's rows) and `diff` (what changed between two snapshots, and
the keys that grew most). Spark's state data sources read the state in a Spark application of their own
(spark_jobs/tools/state_inspect.py), from a restore into a local scratch directory: never the live
checkpoint, which a running query owns. The bytes of each operator's state come from the manifest (the
files' sizes), not from Spark."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from ..errors import Refused
from ..parallel import DEFAULT_CONCURRENCY
from ..records.manifest import Manifest, SnapshotStatus
from ..spark_app import run_spark_tool
from .restore import restore_scratch
from .state_stats import state_stats
from .store import SnapshotStore

TOOL = "state_inspect"


def _completed(store: SnapshotStore, job: str, snapshot_id: str) -> Manifest:
    manifest = store.get(job, snapshot_id)
    if manifest.status is not SnapshotStatus.COMPLETED:
        raise Refused(
            f"snapshot {manifest.id} of job {job} is {manifest.status}: only COMPLETED snapshots hold a state to "
            f"read; see `savepoints list {job}`"
        )
    return manifest


def _sizes(manifest: Manifest) -> dict[int, dict[str, Any]]:
    """Per operator id: the bytes of its state files at the snapshot's batch, and their skew by partition."""
    stats = state_stats(((f.path, f.size) for f in manifest.files), manifest.operators)
    return {op["id"]: op for op in stats}


def _describe(manifest: Manifest) -> dict[str, Any]:
    return {"id": manifest.id, "batch_id": manifest.batch_id, "created_at": manifest.created_at}


def inspect_snapshot(
    store: SnapshotStore,
    job: str,
    snapshot_id: str,
    *,
    key: str | None = None,
    sample: int = 5,
    spark_conf: dict[str, str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> dict[str, Any]:
    """What the snapshot's state holds, per operator and store (see the module doc)."""
    manifest = _completed(store, job, snapshot_id)
    result: dict[str, Any] = {"job": job, "snapshot": _describe(manifest), "operators": [], "problems": []}
    if manifest.operators:
        with tempfile.TemporaryDirectory(prefix="savepoints-inspect-") as tmp:
            scratch = Path(tmp) / "checkpoint"
            plan = restore_scratch(store, job, manifest.id, scratch, concurrency=concurrency)
            out = Path(tmp) / "result.json"
            args = ["inspect", "--checkpoint", str(scratch), "--batch", str(manifest.batch_id), "--out", str(out)]
            args += ["--sample", str(sample)] + (["--key", key] if key is not None else [])
            run_spark_tool(TOOL, args, conf={**(spark_conf or {}), **plan.spark_conf})
            result |= {k: v for k, v in json.loads(out.read_text()).items() if k in ("operators", "problems")}
    sizes = _sizes(manifest)
    for entry in result["operators"]:
        size = sizes.get(entry["operator"], {})
        entry["operator_bytes"] = size.get("bytes")  # all stores of the operator: the files, not the rows
        entry["bytes_skew"] = size.get("skew")
    result["key"] = key
    return result


def diff_snapshots(
    store: SnapshotStore,
    job: str,
    a: str,
    b: str,
    *,
    top: int = 10,
    spark_conf: dict[str, str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> dict[str, Any]:
    """Per operator and store, what changed from snapshot `a` to snapshot `b` (see the module doc)."""
    before, after = _completed(store, job, a), _completed(store, job, b)
    result: dict[str, Any] = {"job": job, "a": _describe(before), "b": _describe(after), "operators": []}
    result["problems"] = []
    if before.operators or after.operators:
        with tempfile.TemporaryDirectory(prefix="savepoints-diff-") as tmp:
            scratch_a, scratch_b = Path(tmp) / "a", Path(tmp) / "b"
            plan_a = restore_scratch(store, job, before.id, scratch_a, concurrency=concurrency)
            plan_b = restore_scratch(store, job, after.id, scratch_b, concurrency=concurrency)
            out = Path(tmp) / "result.json"
            args = ["diff", "--a", str(scratch_a), "--a-batch", str(before.batch_id)]
            args += ["--b", str(scratch_b), "--b-batch", str(after.batch_id), "--top", str(top), "--out", str(out)]
            conf = {**(spark_conf or {}), **plan_a.spark_conf, **plan_b.spark_conf}
            run_spark_tool(TOOL, args, conf=conf)
            result |= {k: v for k, v in json.loads(out.read_text()).items() if k in ("operators", "problems")}
    sizes_a, sizes_b = _sizes(before), _sizes(after)
    for entry in result["operators"]:
        entry["operator_bytes_a"] = sizes_a.get(entry["operator"], {}).get("bytes")
        entry["operator_bytes_b"] = sizes_b.get(entry["operator"], {}).get("bytes")
    return result
