"""The engine's starts that are not a restore (docs/architecture.md "Replay and migration"): `--seed` starts an
empty checkpoint at given Kafka positions, or after given files of a file source, and watermark (a replay's or a
migration's green), `--migration`
asks for a migration run (migration.py). Both arrive as JSON; this module parses them and writes the seed.

A seed is written into the checkpoint before the query starts, and only while it has no offsets yet (a
restarted green continues from its own log):
- `sources/<i>/0`: the Kafka source i's initial positions, the file Spark's Kafka source reads its
  `startingOffsets` from (format: airflow_plugin.core.snapshots.checkpoint.kafka_initial_offsets); with a
  `boundary` (a replay by broker timestamps), one record earlier per partition, so that batch 0 reads exactly
  those records: the replay checks their event times;
- `sources/<i>/0` of a file source i: the files of the old version's log it starts after, counted as seen and
  read by no batch (format and why: airflow_plugin.core.sources.files), its position `{"logOffset":0}`;
- `offsets/0`: batch 0 planned with those positions as its end, and the seeded watermark. Without
  `commits/0` Spark re-runs batch 0 (MicroBatchExecution.populateStartOffsets), from the initial positions
  (the start of a first batch) to its logged end: the same positions, so batch 0 reads nothing and batch 1
  starts exactly there, with the seeded watermark. Its metadata line carries the session's SQL confs, made by
  Spark's own OffsetSeqMetadata: a conf missing from an offset log is read back with its legacy default.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_plugin.core.snapshots.checkpoint import kafka_initial_offsets
from airflow_plugin.core.snapshots.restore import METADATA
from airflow_plugin.core.sources import FILE, KAFKA, positions
from airflow_plugin.core.sources import files as file_log
from airflow_plugin.core.storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

NO_OFFSET = "-"  # an offset log line for a source without a position
OFFSET_LOG_VERSION = "v1"  # the offset log format written (positional lines, one per source)
_METADATA_CLASS = "org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata"  # Spark 4.2's package


class SeedRefused(Exception):
    """A seed that cannot be applied: nothing was written."""

    error_class = "SEED_REFUSED"


def _object(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{what} is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{what} must be a JSON object, got {text[:200]!r}")
    return data


@dataclass(frozen=True)
class Seed:
    """Where an empty checkpoint starts: per source (in the query's order) its offset JSON or None, the
    watermark of the first batch, and per file source the old checkpoint whose files it starts after (up to its
    log id `through`, or modified before `before_ms`: airflow_plugin.core.upgrades.replay)."""

    offsets: tuple[str | None, ...]
    watermark_ms: int
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    boundary: tuple[str | None, ...] | None = None  # Kafka initial positions before `offsets`: batch 0 reads between

    @classmethod
    def of(cls, data: dict[str, Any], what: str = "--seed") -> Seed:
        offsets, watermark, files = data.get("offsets"), data.get("watermark_ms", 0), data.get("files") or {}
        boundary = data.get("boundary")
        for name, value in (("offsets", offsets), ("boundary", [] if boundary is None else boundary)):
            if not isinstance(value, list) or not all(o is None or isinstance(o, str) for o in value):
                raise argparse.ArgumentTypeError(f"{what}: '{name}' must be a list of offset JSON strings or nulls")
        if boundary is not None and len(boundary) != len(offsets):
            raise argparse.ArgumentTypeError(f"{what}: 'boundary' must name as many sources as 'offsets'")
        if not isinstance(watermark, int) or isinstance(watermark, bool) or watermark < 0:
            raise argparse.ArgumentTypeError(f"{what}: 'watermark_ms' must be a non-negative integer")
        for source, bound in files.items() if isinstance(files, dict) else [("", None)]:
            if not (
                isinstance(bound, dict)
                and isinstance(bound.get("checkpoint"), str)
                and sum(isinstance(bound.get(k), int) for k in ("through", "before_ms")) == 1
            ):
                raise argparse.ArgumentTypeError(
                    f"{what}: 'files' must map a source id to {{'checkpoint': URI, 'through' or 'before_ms': int}}, "
                    f"got {source!r}: {bound!r}"
                )
        return cls(tuple(offsets), watermark, dict(files), None if boundary is None else tuple(boundary))

    @classmethod
    def from_json(cls, text: str) -> Seed:
        return cls.of(_object(text, "--seed"))


@dataclass(frozen=True)
class MigrationRequest:
    """A migration run (migration.py): `function` turns the state of checkpoint `state` at `batch_id` into the
    new version's initial state, written to `output`; the check run starts at `seed`."""

    function: str
    state: str
    batch_id: int
    output: str
    seed: Seed

    @classmethod
    def from_json(cls, text: str) -> MigrationRequest:
        data = _object(text, "--migration")
        missing = [k for k in ("function", "state", "batch_id", "output", "seed") if data.get(k) in (None, "")]
        if missing:
            raise argparse.ArgumentTypeError(f"--migration lacks {', '.join(missing)}: {text[:200]!r}")
        seed = Seed.of(data["seed"], "--migration seed")
        return cls(str(data["function"]), str(data["state"]), int(data["batch_id"]), str(data["output"]), seed)


def offset_log_entry(spark: SparkSession, seed: Seed) -> bytes:
    """`offsets/0` for `seed`: Spark's own metadata line (the watermark, now, the session's SQL confs that
    Spark pins in the offset log), then each source's end offset."""
    jvm: Any = spark.sparkContext._jvm
    metadata_class = jvm
    for part in _METADATA_CLASS.split("."):
        metadata_class = getattr(metadata_class, part)
    metadata = json.loads(
        metadata_class.apply(seed.watermark_ms, int(time.time() * 1000), spark._jsparkSession.conf()).json()
    )
    # A conf Spark reads with a default of its own comes out null (spark.sql.shuffle.partitions: the query's
    # session sets it before Spark writes its log): the session's effective value, as Spark's own log has it
    session_conf = spark._jsparkSession.sessionState().conf()
    for key, value in metadata.get("conf", {}).items():
        if value is None:
            metadata["conf"][key] = session_conf.getConfString(key)
    header = json.dumps(metadata, separators=(",", ":"))
    lines = [OFFSET_LOG_VERSION, header, *(offset or NO_OFFSET for offset in seed.offsets)]
    return "\n".join(lines).encode()


def apply_seed(spark: SparkSession, checkpoint: str, seed: Seed, *, only_kafka: bool = True) -> bool:
    """Write `seed` into `checkpoint` unless its offset log has begun (then False: the query continues).
    A position of another source is refused (SeedRefused); `only_kafka` False leaves such sources without
    one in batch 0 instead, which then reads nothing of them (a migration's check runs batch 0 only)."""
    storage = open_storage(checkpoint)
    if any(True for _ in storage.list("offsets/")):
        log.info("seed not applied: %s already has offsets (a restart continues its own log)", checkpoint)
        return False
    given = positions(1, [o or NO_OFFSET for o in seed.offsets])
    not_kafka = [p for p in given if p.kind != KAFKA and not (p.kind == FILE and p.source in seed.files)]
    if not_kafka and not only_kafka:
        left_out = {int(p.source) for p in not_kafka}
        offsets = tuple(None if i in left_out else o for i, o in enumerate(seed.offsets))
        seed = Seed(offsets, seed.watermark_ms, seed.files, seed.boundary)
    elif not_kafka:
        raise SeedRefused(
            f"cannot start source(s) {', '.join(f'{p.source} ({p.kind})' for p in not_kafka)} at given positions: "
            "only a Kafka source's start, or a file source's files to start after, can be set. Start a job with "
            "another source fresh (no seed)"
        )
    if storage.stat(METADATA) is None:  # the engine writes it for a green; a migration's check run has none
        storage.write(METADATA, json.dumps({"id": str(uuid.uuid4())}).encode())
    for index, offset in enumerate(seed.offsets):  # what is left: Kafka positions and seeded file sources
        if str(index) in seed.files:
            storage.write(f"sources/{index}/0", _seen_files(str(index), seed.files[str(index)]))
        elif offset is not None:
            initial = seed.boundary[index] if seed.boundary and seed.boundary[index] else offset
            storage.write(f"sources/{index}/0", kafka_initial_offsets(initial))
    storage.write("offsets/0", offset_log_entry(spark, seed))
    log.info("seeded %s: batch 1 starts at %s, watermark %d ms", checkpoint, list(seed.offsets), seed.watermark_ms)
    return True


def _seen_files(source: str, bound: dict[str, Any]) -> bytes:
    """A file source's seeded log: the files of the old checkpoint's log (its source `source`) it starts after."""
    logged = file_log.log_entries(open_storage(bound["checkpoint"]), source)
    return file_log.seen_log(file_log.seen(logged, through=bound.get("through"), before_ms=bound.get("before_ms")))
