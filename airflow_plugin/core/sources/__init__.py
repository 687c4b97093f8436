"""Sources, as far as snapshots must know them: where each source of a query stood at a snapshot's batch N.

Spark logs, in `offsets/N`, one position per source: the NEXT offset to read, where batch N+1 starts. The
log's first line is its version and decides the layout of the lines after the metadata line
(SPARK_CHECKPOINTS.md section 1):

    v1    one line per source, in the order of the sources in the plan:   {"events":{"0":42,"1":40}}
    v2    one line per source, its id first (Spark 4.1+ offset log v2):   0:{"events":{"0":42,"1":40}}

A line `-` (or `<id>:-`) is a source without a position yet. What a position means depends on the
source: a Kafka source's is a JSON object of topics, each an object of partition -> next offset; a file
source's is `{"logOffset": n}`; a rate source's a number. Kafka positions and what a broker still holds
after them: kafka.py."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError

NO_OFFSET = "-"
_SOURCE_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")  # "0", "1", ... or a source's name
KAFKA = "kafka"
FILE = "file"
RATE = "rate"
OTHER = "other"


def offsets_by_source(version: int, lines: Sequence[str], where: str = "offsets") -> dict[str, str]:
    """Source id -> the offset JSON logged for it (sources without a position left out), by the log's version:
    v1 lines are positional (id = the source's index), v2 lines carry their id."""
    found: dict[str, str] = {}
    for index, line in enumerate(line for line in lines if line != ""):
        if version >= 2:
            source, sep, offset = line.partition(":")
            if not sep or not _SOURCE_ID.match(source):
                raise CheckpointError(f"{where}: line {line[:60]!r} is not '<source id>:<offset>' (offset log v2)")
        else:
            source, offset = str(index), line
        if offset != NO_OFFSET:
            found[source] = offset
    return found


def _is_kafka(value: Any) -> bool:
    """{"topic": {"0": 42, ...}, ...}: topics, each of partition numbers to offsets."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(
            isinstance(partitions, dict)
            and all(p.lstrip("-").isdigit() and isinstance(o, int) for p, o in partitions.items())
            for partitions in value.values()
        )
    )


def _kind(value: Any) -> str:
    if isinstance(value, dict) and "logOffset" in value:
        return FILE
    if isinstance(value, int):
        return RATE
    return KAFKA if _is_kafka(value) else OTHER


@dataclass(frozen=True)
class SourcePosition:
    """One source's position at a batch: its id, what kind of source wrote it, and the position as logged."""

    source: str
    kind: str
    offset: Any  # the parsed JSON

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "offset": self.offset}


def positions(version: int, lines: Sequence[str], where: str = "offsets") -> list[SourcePosition]:
    """Every source's position in an offsets log's source lines (a snapshot keeps them as `source_offsets`).
    A line that is not JSON is kept as text, of kind `other`."""
    found = []
    for source, text in offsets_by_source(version, lines, where).items():
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        found.append(SourcePosition(source, _kind(value), value))
    return found
