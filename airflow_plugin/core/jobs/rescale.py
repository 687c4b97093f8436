"""Rescale from a snapshot (Flink's "savepoints allow scaling"): the number of state partitions is
pinned by Spark at the first batch, so a different parallelism needs the state repartitioned offline.
Done on the freshly restored copy of a new deployment only, then checked, before the job starts."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..errors import CheckpointError, Refused
from ..records.manifest import Manifest
from ..snapshots.checkpoint import read_restart_point
from ..spark_app import run_spark_tool
from ..storage import Storage, spark_uri

PARTITIONS_CONF = "spark.sql.shuffle.partitions"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"


def current_partitions(manifest: Manifest) -> int | None:
    value = manifest.spark_conf.get(PARTITIONS_CONF)
    return int(value) if value else None


def check_rescalable(manifest: Manifest, partitions: int) -> None:
    """Refuse before anything happens when Spark cannot repartition this state."""
    if partitions < 1:
        raise Refused(f"cannot rescale to {partitions} partitions: give a positive number")
    if manifest.pending_batch_id is not None:
        raise Refused(
            f"snapshot {manifest.id} of job {manifest.job} ends inside batch {manifest.pending_batch_id} (offsets "
            "logged, no commit): Spark repartitions only at a batch boundary. Deploy from it without "
            "--partitions, stop that deployment cleanly with --savepoint, and rescale from the new savepoint"
        )
    provider = manifest.spark_conf.get(PROVIDER_CONF, "")
    if manifest.operators and "RocksDB" not in provider:
        name = provider.rsplit(".", 1)[-1] or "the default"
        raise Refused(
            f"snapshot {manifest.id} of job {manifest.job} holds state of the {name} provider, which Spark's "
            "offline repartition does not support (only RocksDB state): deploy with its "
            f"{current_partitions(manifest)} partitions; nothing was changed"
        )


def repartition(
    checkpoint: Storage, spark_conf: dict[str, str], partitions: int, *, env: dict[str, str] | None = None
) -> int:
    """Repartition a restored, never started checkpoint; return the batch id of the repartition batch."""
    before = read_restart_point(checkpoint).batch_id
    with tempfile.TemporaryDirectory(prefix="savepoints-rescale-") as tmp:
        out = Path(tmp) / "result.json"
        run_spark_tool(
            "repartition",
            ["--checkpoint", spark_uri(checkpoint), "--partitions", str(partitions), "--out", str(out)],
            conf={**spark_conf, PARTITIONS_CONF: str(partitions)},
            env=env,
        )
        result = json.loads(out.read_text())
    if not result.get("ok"):
        raise CheckpointError(
            f"Spark could not repartition {checkpoint.uri} to {partitions} partitions: "
            f"{result.get('error_class')}: {result.get('error', '')}"
        )
    after = read_restart_point(checkpoint)
    if after.batch_id != before + 1 or after.spark_conf.get(PARTITIONS_CONF) != str(partitions):
        raise CheckpointError(
            f"repartitioning {checkpoint.uri} did not commit batch {before + 1} with {partitions} partitions "
            f"(found batch {after.batch_id}, {after.spark_conf.get(PARTITIONS_CONF)} partitions)"
        )
    return after.batch_id
