"""Positions of file sinks. The file sink keeps its own log in `<output>/_spark_metadata/<batch>`,
outside the checkpoint: a restore from an older snapshot must not meet a sink that is ahead of it."""

from __future__ import annotations

import re

from ..storage import Storage

_SINK_LOG = re.compile(r"^_spark_metadata/(\d+)(\.compact)?$")


def sink_position(output: Storage) -> int | None:
    """The last batch id the file sink at `output` committed, or None if it committed none."""
    batches = [int(m.group(1)) for info in output.list("_spark_metadata/") if (m := _SINK_LOG.match(info.key))]
    return max(batches) if batches else None
