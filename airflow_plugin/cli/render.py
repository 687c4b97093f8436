"""Rendering, apart from doing: a command returns an `Output` (data, and how a person reads it); this
module prints it as JSON (`--json`) or as text and tables (rich), and draws progress bars on a terminal."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.status import Status
from rich.table import Table
from rich.text import Text

from ..core.records.manifest import Listed
from ..core.retention.plan import Plan
from ..core.sources.kafka import SourceCheck

# Piped output (grep, logs) gets wide lines instead of a table squeezed to 80 columns.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 240)


@dataclass
class Output:
    """What a command produced: `data` for --json, `human` prints it for a person; `exit_code` is 0 unless
    the command reports a failure as data (a verify that found problems); `error`, raised after the output
    is shown (a blocked pre-flight prints its report, then fails)."""

    data: Any
    human: Callable[[], None]
    exit_code: int = 0
    error: Exception | None = None


def emit(output: Output, as_json: bool) -> None:
    if not as_json:
        output.human()
        return
    text = json.dumps(output.data, default=str)
    if out.is_terminal:
        out.print_json(text)
    else:
        print(text)


def fail(message: str, code: int, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"error": message, "exit_code": code}))
    err.print(Text.assemble(("error: ", "red"), message), soft_wrap=True)  # one line, however long
    return code


def warn(message: str) -> None:
    err.print(Text.assemble(("warning: ", "yellow"), message))


def note(message: str) -> None:
    """One line on stderr, however long (a deprecated form of a command: what to write instead)."""
    err.print(Text.assemble(("note: ", "yellow"), message), soft_wrap=True)


def say(text: str) -> None:
    """A line of text that may hold names from the store or the user: never read as rich markup."""
    out.print(Text(text))


class BarProgress:
    """What the engine reports, on stderr and only on a terminal: a rich progress bar for transfers, and a
    spinner with the current stage and the seconds it has waited (a deploy's launch, Spark session, first
    batch)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or err
        self._bar: Progress | None = None
        self._task: Any = None
        self._status: Status | None = None
        self._since = 0.0
        self._lock = threading.Lock()

    def start(self, description: str, total_bytes: int, total_files: int) -> None:
        if not self.console.is_terminal:
            return
        self._end_stage()
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(escape(f"{description} ({total_files} files)"), total=total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.advance(self._task, nbytes)

    def stage(self, text: str) -> None:
        if not self.console.is_terminal or self._bar is not None:
            return
        if self._status is None:
            self._since = time.monotonic()
            self._status = Status("", console=self.console)
            self._status.start()
        self._status.update(Text(f"{text} ({time.monotonic() - self._since:.0f}s)"))

    def _end_stage(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def finish(self) -> None:
        self._end_stage()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def age(timestamp: str | None) -> str:
    if not timestamp:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds()
    return seconds_ago(seconds)


def seconds_ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{int(seconds // length)}{unit}"
    return f"{int(seconds)}s"


def dash(value: object) -> str:
    return "-" if value is None else str(value)


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[str] = ()) -> Table:
    """A plain table; cells are text, never markup (names and labels come from users)."""
    shown = Table(show_edge=False, header_style="bold")
    for column in columns:
        shown.add_column(column, justify="right" if column in numeric else "left", no_wrap=column != "reason")
    for row in rows:
        shown.add_row(*(Text(cell) for cell in row))
    return shown


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in labels.items())


def source_text(check: SourceCheck | None) -> str:
    """A snapshot's sources in a table cell: '-' (no Kafka source), 'ok', 'unchecked', or the records gone."""
    if check is None:
        return "-"
    if not check.checked:
        return "unchecked"
    if check.restorable:
        return "ok"
    return f"GONE: {check.records_lost:,}{'+' if check.lost_unknown else ''} records"


def snapshot_table(manifests: Sequence[Listed], checks: Mapping[str, SourceCheck] | None = None) -> Table:
    """Snapshots; `checks` marks those whose Kafka records are gone (they cannot be restored without a gap)."""
    checks = checks or {}
    columns = ("job", "id", "kind", "trigger", "status", "batch", "files", "size", "uploaded", "age", "pin")
    columns += ("source", "labels")
    rows = [
        (
            m.job,
            m.id,
            str(m.kind),
            str(m.trigger),
            str(m.status),
            dash(m.batch_id),
            str(m.file_count),
            human_bytes(m.total_bytes),
            human_bytes(m.uploaded_bytes),
            age(m.created_at),
            "yes" if m.pinned else "",
            source_text(checks.get(m.id)),
            labels_text(m.labels),
        )
        for m in manifests
    ]
    return table(columns, rows, numeric=("batch", "files", "size", "uploaded"))


def status_table(rows: Sequence[dict[str, Any]]) -> Table:
    columns = ("job", "deployment", "version", "state", "heartbeat", "batch", "rows/s", "restored from")
    shown = [
        (
            r["job"],
            r["deployment"],
            r["version"],
            r["state"]
            + (" UNHEALTHY" if r.get("unhealthy") else "")
            + (f" ({r['gate']})" if r.get("gate") else "")
            + (
                f" (driver: {r['driver']})"
                if r.get("driver") in ("gone", "cannot tell") and r["state"] != "STOPPED"
                else ""
            ),
            seconds_ago(r["heartbeat_age_s"]),
            dash(r["last_batch_id"]),
            "-" if r["rows_per_second"] is None else f"{r['rows_per_second']:.0f}",
            (r["restored_from"] or "") + (f" (source gap: {r['source_gap']})" if r.get("source_gap") else ""),
        )
        for r in rows
    ]
    return table(columns, shown, numeric=("batch", "rows/s"))


def plan_table(plan: Plan) -> Table:
    return table(("action", "job", "target", "reason"), plan.rows())


def key_values(data: dict[str, Any]) -> Table:
    shown = Table(show_header=False, show_edge=False)
    for key, value in data.items():
        shown.add_row(key, Text(json.dumps(value) if isinstance(value, dict | list) else str(value)))
    return shown
