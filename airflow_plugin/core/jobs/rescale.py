"""Rescale from a snapshot (Flink's "savepoints allow scaling"): the number of state partitions is
pinned by Spark at the first batch, so a different parallelism needs the state repartitioned offline.
Done on the freshly restored copy of a new deployment only, then checked, before the job starts."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..compactible_log import log_id, needed_for
from ..errors import CheckpointError, Refused
from ..records.manifest import Manifest
from ..sinks import FILE
from ..sinks import file as file_sink
from ..snapshots.checkpoint import read_restart_point
from ..spark_app import run_spark_tool
from ..storage import Storage, spark_uri

log = logging.getLogger(__name__)
PARTITIONS_CONF = "spark.sql.shuffle.partitions"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SINK_COMPACT_CONF = "spark.sql.streaming.fileSink.log.compactInterval"
SINK_COMPACT_DEFAULT = 10


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
        name = provider.rsplit(".", 1)[-1] or "default"
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


def log_repartition_batch(
    manifest: Manifest, batch_id: int, open_location: Callable[[str], Storage], spark_conf: dict[str, str]
) -> list[str]:
    """The repartition batch `batch_id` in the file sinks' logs, as Spark writes a batch that adds no file: the
    repartition commits it in the checkpoint and runs no query, and a file sink's log must hold every batch id
    between two compactions (at the next one Spark reads them all: BATCH_METADATA_NOT_FOUND for the missing id,
    and the restarted query fails at every start). An empty entry, or the compact file when `batch_id` is a
    compaction's. Only a sink at the batch before (the restore rewound it to the snapshot's batch) is written;
    returns the log files written."""
    written = []
    for sink in manifest.sinks:
        if sink.get("kind", FILE) != FILE:
            continue  # Delta skips only batch ids at or below its newest: a gap is nothing to it
        output = open_location(sink["location"])
        files = file_sink.log_files(output)
        if (position := file_sink.position(output)) != batch_id - 1:
            log.warning(
                "the file sink %s is at batch %s, not %d: the repartition batch %d is not logged in it",
                sink["location"],
                position,
                batch_id - 1,
                batch_id,
            )
            continue
        interval = _compact_interval(files, int(spark_conf.get(SINK_COMPACT_CONF) or SINK_COMPACT_DEFAULT))
        if (batch_id + 1) % interval:
            name, body = str(batch_id), "v1"
        else:  # the compaction batch: every entry up to it, what a compaction of an empty batch writes
            name, body = f"{batch_id}.compact", _compacted(output, files, batch_id - 1)
        output.write(f"{file_sink.LOG_DIR}{name}", body.encode())
        written.append(f"{sink['location'].rstrip('/')}/{file_sink.LOG_DIR}{name}")
    return written


def _compact_interval(files: dict[str, object], default: int) -> int:
    """Spark's compaction interval of a log (CompactibleFileStreamLog.compactInterval): the configured one, unless
    the newest compact file says the log was written with another (deriveCompactInterval)."""
    compacts = [b[0] for name in files if (b := log_id(name)) and b[1]]
    if not compacts or (max(compacts) + 1) % default == 0:
        return default
    latest = max(compacts) + 1
    if latest <= default:
        return latest
    if default < latest // 2:
        return next(i for i in [*range(default, latest // 2 + 1), latest] if latest % i == 0)
    return latest


def _compacted(output: Storage, files: dict[str, object], batch_id: int) -> str:
    """A compact file holding every entry of the log up to `batch_id`, deleted files left out (as Spark's
    FileStreamSinkLog.compactLogs); the entries' lines as Spark wrote them."""
    lines = [
        line
        for name in needed_for(files, batch_id)
        for line in output.read(f"{file_sink.LOG_DIR}{name}").decode().splitlines()[1:]
        if line.strip()
    ]
    deleted = {entry["path"] for line in lines if (entry := json.loads(line)).get("action") == "delete"}
    kept = [line for line in lines if json.loads(line)["path"] not in deleted]
    return "\n".join(["v1", *kept])
