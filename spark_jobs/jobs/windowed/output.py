"""Reading the windowed job's final output without Spark, for tests and checks: a file sink's directory
(`read_output`) or a Delta table (`read_table`: the data files its log holds now, read with pyarrow).

Only files the file sink COMMITTED count: a batch that failed or was killed may have left part files
in the directory that its log never listed, and a replayed batch writes new part files while the log
keeps the first. So the reader follows `<output>/_spark_metadata` (what Spark's own reader does): the
newest `<n>.compact` file (every 10th batch, holding all entries up to it) plus the plain batch files
after it; entries are `add` or `delete` of absolute file URIs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from airflow_plugin.core.compactible_log import log_id, needed_for
from airflow_plugin.core.sinks.delta import live_files
from airflow_plugin.core.sinks.file import committed
from airflow_plugin.core.storage import Storage


def _log_files(output: Path) -> list[Path]:
    """The sink log files to read, in batch order: the newest compact file and the batches after it."""
    log_dir = output / "_spark_metadata"
    ids = {path.name: logged for path in log_dir.iterdir() if (logged := log_id(path.name))} if log_dir.is_dir() else {}
    if not ids:
        return []
    return [log_dir / name for name in needed_for(ids, max(logged[0] for logged in ids.values()))]


def committed_files(output: Path) -> list[Path]:
    """The part files the sink committed, as local paths (a relocated output is matched by file name)."""
    files = committed(log_file.read_bytes() for log_file in _log_files(output))
    return [_local(uri, output) for uri in files]


def _local(uri: str, output: Path) -> Path:
    path = Path(unquote(urlparse(uri).path))
    return path if path.exists() else output / path.name


def read_output(output: Path) -> list[dict[str, Any]]:
    """Every committed output row, as dicts: user, [country,] window_start, window_end, events, version,
    [events_per_second]."""
    rows: list[dict[str, Any]] = []
    for part in committed_files(output):
        rows.extend(json.loads(line) for line in part.read_text().splitlines() if line.strip())
    return rows


def read_table(table: Storage) -> list[dict[str, Any]]:
    """Every row of the Delta table's newest version, as dicts (the same columns as `read_output`)."""
    import pyarrow.parquet as parquet  # only here: the file sink's reader needs no pyarrow

    rows: list[dict[str, Any]] = []
    for key in live_files(table):
        with table.fetched(key) as local:
            rows.extend(parquet.read_table(local).to_pylist())
    return rows


def row_key(row: dict[str, Any]) -> tuple[object, ...]:
    """(user, country or None, window start): what must not appear twice."""
    return row.get("user"), row.get("country"), row["window_start"]


@dataclass(frozen=True)
class Summary:
    rows: int
    events: int  # the sum of the counts
    duplicates: list[tuple[object, ...]]  # keys that appear more than once
    versions: dict[str, int]  # rows per emitting version
    # windows (their start) with rows of more than one version: across an upgrade each window has one writer,
    # also when the versions group differently (per user, per user and country, per country)
    shared_windows: list[object] = field(default_factory=list)


def summarize(rows: Iterable[dict[str, Any]]) -> Summary:
    """What an exactly-once check compares: events == events fed, no duplicates, one version per window."""
    rows = list(rows)
    keys = Counter(row_key(row) for row in rows)
    writers: dict[object, set[str]] = {}
    for row in rows:
        writers.setdefault(row["window_start"], set()).add(str(row.get("version")))
    return Summary(
        rows=len(rows),
        events=sum(int(row["events"]) for row in rows),
        duplicates=sorted((k for k, n in keys.items() if n > 1), key=str),
        versions=dict(Counter(str(row.get("version")) for row in rows)),
        shared_windows=sorted((w for w, versions in writers.items() if len(versions) > 1), key=str),
    )
