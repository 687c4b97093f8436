"""Spark's compactible file logs: a file sink's `_spark_metadata/` (sinks/file.py) and a file source's
`sources/<i>/` in the checkpoint (sources/files.py). Both are a directory of files named by log id, `N`, each
holding the entries that id added, and every `compactInterval` ids (10) an `N.compact` holding every entry up to
N (Spark later deletes the files it replaces). A file's first line is the log's version (`v1`), then one JSON
entry a line. Which files make up the log at an id, and the entries they hold, are the same for both."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

LOG_FILE = re.compile(r"^(\d+)(\.compact)?$")


def log_id(name: str) -> tuple[int, bool] | None:
    """`7` -> (7, False), `9.compact` -> (9, True); None for anything else (temporary files, checksums)."""
    match = LOG_FILE.match(name)
    return (int(match[1]), bool(match[2])) if match else None


def needed_for(names: Iterable[str], batch_id: int) -> list[str]:
    """The log files whose entries make up the log at `batch_id`: the newest compact file at or before it and
    the files after that compact, up to `batch_id` (Spark's own reading order)."""
    parsed = [(name, b) for name in names if (b := log_id(name)) is not None and b[0] <= batch_id]
    compacts = [b[0] for _, b in parsed if b[1]]
    start = max(compacts) if compacts else -1
    chosen = [(b[0], name) for name, b in parsed if (b[1] and b[0] == start) or (not b[1] and b[0] > start)]
    return [name for _, name in sorted(chosen)]


def complete_at(names: Iterable[str], batch_id: int) -> bool:
    """Whether `names` hold every log file the log at `batch_id` needs (none compacted away)."""
    chosen = needed_for(names, batch_id)
    compacts = [b[0] for name in chosen if (b := log_id(name)) and b[1]]
    start = compacts[0] if compacts else -1
    have = {b[0] for name in chosen if (b := log_id(name)) and not b[1]}
    return have == set(range(start + 1, batch_id + 1))


def entries(raw: bytes) -> list[dict[str, Any]]:
    """The JSON entries of one log file (its first line is the log's version)."""
    return [json.loads(line) for line in raw.decode("utf-8").splitlines()[1:] if line.strip()]
