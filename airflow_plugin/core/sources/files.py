"""A file source's own log in the checkpoint, `sources/<i>/` (a compactible log: compactible_log.py): which
files the query has seen. Each entry is `{"path", "timestamp", "batchId"}`: the file's URI, its modification
time (ms) and the source's log id that took it in. The source's position in `offsets/N` is `{"logOffset": L}`:
every file the log holds up to id L was read by batch N or before it.

A replay's green starts after files it must not read again (upgrades/replay.py): its own log begins with an
entry for each of them (`seen_log`), which Spark's file source counts as seen when it starts (it builds its
seen-files set from every entry of its log) but never reads, because it reads a log id's files by their
`batchId` (FileStreamSourceLog.get keeps the entries whose batchId is the id it reads) and these carry one no
batch reaches. Batch 0 is planned at log offset 0 and reads none of them; batch 1 lists the directory and
takes in every file not seen: exactly the ones after the replay's start. Spark 4.2's behaviour, pinned by
tests/runtime/test_replay_runtime.py."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from ..compactible_log import entries, log_id, needed_for
from ..storage import Storage

START = '{"logOffset":0}'  # the position of a seeded file source's batch 0: its log's first id
NOTHING_READ = '{"logOffset":-1}'  # where a file source stands before its first batch
# the log id the seeded entries carry: one no batch reaches (2^40 batches), so none of them is read again,
# small enough for Spark's arithmetic on log ids (a compaction's range from it)
SEEN_BEFORE_START = 1 << 40


def log_offset(line: str) -> int | None:
    """L of a file source's position `{"logOffset": L}`, None for anything else."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    offset = value.get("logOffset") if isinstance(value, dict) else None
    return offset if isinstance(offset, int) else None


def log_entries(checkpoint: Storage, source: str) -> list[dict[str, Any]]:
    """Every entry of source `source`'s log in a checkpoint: the newest compact file and the files after it."""
    prefix = f"sources/{source}/"
    names = {info.key[len(prefix) :]: info.key for info in checkpoint.list(prefix) if log_id(info.key[len(prefix) :])}
    if not names:
        return []
    newest = max(b[0] for name in names if (b := log_id(name)))
    return [entry for name in needed_for(names, newest) for entry in entries(checkpoint.read(names[name]))]


def seen(
    logged: list[dict[str, Any]], *, through: int | None = None, before_ms: int | None = None
) -> list[dict[str, Any]]:
    """The entries a replay starts after: those the log took in at ids up to `through` (exact, from the old
    query's offset log), or those modified before `before_ms` (by file times, when that log no longer reaches
    back)."""
    if through is not None:
        return [e for e in logged if int(e["batchId"]) <= through]
    if before_ms is not None:
        return [e for e in logged if int(e["timestamp"]) < before_ms]
    return []


def seen_log(files: list[dict[str, Any]]) -> bytes:
    """The content of a seeded source's `sources/<i>/0`: every file in `files`, counted as seen, read by no batch."""
    lines = ["v1"] + [
        json.dumps(
            {"path": e["path"], "timestamp": int(e["timestamp"]), "batchId": SEEN_BEFORE_START}, separators=(",", ":")
        )
        for e in files
    ]
    return "\n".join(lines).encode()


def missing(uris: Iterable[str], open_location: Callable[[str], Storage]) -> list[str]:
    """Which of these file URIs (as a file source logs them) are no longer there: one listing per directory."""
    by_directory: dict[str, set[str]] = defaultdict(set)
    for uri in uris:
        directory, _, name = uri.rpartition("/")
        by_directory[directory].add(name)
    gone = []
    for directory, names in sorted(by_directory.items()):
        present = {info.key for info in open_location(directory).list() if "/" not in info.key}
        gone += [f"{directory}/{name}" for name in sorted(names - present)]
    return gone
