"""Sinks, as far as snapshots must know them. A restored query replays batches after its snapshot's batch
N into the SAME sink; an exactly-once sink that already committed those batches skips them, so their
records are lost and (stateful queries) the state versions they should have written never exist. So every
snapshot of a managed job records where its sinks are, and every restore checks that no sink is ahead of
it (the guard), or rewinds the sink first (`--rewind-sink`).

Which sinks are understood (guarded and rewindable) is `GUARDED`: the file sink (file.py) and Delta
tables (delta.py); a managed job's sink is what Spark
itself reports in the query's progress (`sink.description`), recorded by the job runtime in its status."""

from __future__ import annotations

import re
from dataclasses import dataclass

FILE = "file"
DELTA = "delta"
UNGUARDED = "unguarded"  # a sink the engine does not understand: recorded by Spark's description, not checked
GUARDED = (FILE, DELTA)  # sinks whose position a snapshot records and a restore checks
_SPARK_NAMES = {FILE: "FileSink", DELTA: "DeltaSink"}  # how Spark's progress names them: FileSink[<path>]
_DESCRIPTIONS = {kind: re.compile(rf"^{name}\[(?P<location>.+)\]$") for kind, name in _SPARK_NAMES.items()}


@dataclass(frozen=True)
class SinkRef:
    kind: str
    location: str

    @property
    def description(self) -> str:
        """As Spark's progress describes the sink (what `from_description` reads back)."""
        name = _SPARK_NAMES.get(self.kind)
        return f"{name}[{self.location}]" if name else self.location


def from_description(description: str | None) -> SinkRef | None:
    """The sink of Spark's progress `sink.description` (`FileSink[s3a://bucket/out]`); a sink the engine
    does not understand (Kafka, foreachBatch, console) comes back UNGUARDED with the description as its
    location, so that snapshots still say what it was. None when Spark reported nothing yet."""
    if not description or not description.strip():
        return None
    for kind, pattern in _DESCRIPTIONS.items():
        if match := pattern.match(description.strip()):
            return SinkRef(kind, match["location"])
    return SinkRef(UNGUARDED, description.strip())
