"""Upgrades that change the state, without Spark: where a replay starts (core/upgrades/replay.py) from an offset log
written the way Spark writes it and a broker's answers, and which mode the pre-flight picks when the new version
cannot take over the old state (core/upgrades/mode.py). The real thing, with drivers, a broker and a Delta
table: tests/e2e/test_state_upgrades.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.snapshots.checkpoint import OffsetLog, kafka_initial_offsets, parse_kafka_initial_offsets
from airflow_plugin.core.sources import files as file_log
from airflow_plugin.core.sources import positions
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.mode import decide
from airflow_plugin.core.upgrades.record import Mode
from airflow_plugin.core.upgrades.replay import (
    FILES,
    HISTORY,
    TIMESTAMPS,
    TOPIC_START,
    ReplayStart,
    check_first_batch,
    delay_difference,
    from_history,
    plan_replay,
)
from tests.core.test_upgrades import seen

MINUTE = 60_000
TOPIC = "events"


def kafka(*offsets: int) -> str:
    return json.dumps({TOPIC: {str(p): o for p, o in enumerate(offsets)}}, separators=(",", ":"))


def write_log(checkpoint: Path, batches: dict[int, tuple[int, str]], initial: str | None = None) -> OffsetLog:
    """An offset log as Spark writes it: `offsets/<n>` = version, metadata (with the batch's watermark), one line
    per source; and the Kafka source's initial positions in `sources/0/0`."""
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"q"}')
    for batch, (watermark, line) in batches.items():
        meta = {"batchWatermarkMs": watermark, "batchTimestampMs": 0, "conf": {}}
        (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{line}")
    if initial is not None:
        (checkpoint / "sources" / "0").mkdir(parents=True)
        (checkpoint / "sources" / "0" / "0").write_bytes(kafka_initial_offsets(initial))
    return OffsetLog(open_storage(str(checkpoint)))


def held(*ranges: tuple[int, int]) -> dict[str, dict[int, tuple[int, int]]]:
    return {TOPIC: dict(enumerate(ranges))}


def plan(log: OffsetLog | None, **changes: Any) -> Any:
    arguments: dict[str, Any] = {
        "horizon_ms": 2 * MINUTE,
        "snapshot_watermark_ms": 10 * MINUTE,
        "snapshot_sources": positions(1, [kafka(900, 800)]),
        "history": log,
        "watermarks": held((0, 1000), (0, 1000)),
        "by_time": None,
        "margin_ms": MINUTE,
    }
    return plan_replay(**{**arguments, **changes})


def test_the_initial_offsets_file_is_spark_kafka_sources_format() -> None:
    raw = kafka_initial_offsets(kafka(5, 7))
    assert raw.startswith(b"\x00v1\n") and parse_kafka_initial_offsets(raw) == kafka(5, 7)
    assert parse_kafka_initial_offsets(b"v2\n{}") is None


def test_a_replay_starts_where_the_last_batch_before_the_horizon_began(tmp_path: Path) -> None:
    # watermarks of batches 10..15: the horizon (W 10 min - 2 min = 8 min) lies between batches 12 and 13
    watermarks = {10: 5, 11: 6, 12: 7, 13: 8, 14: 9, 15: 10}
    log = write_log(tmp_path, {b: (w * MINUTE, kafka(b * 10, b * 5)) for b, w in watermarks.items()})
    reads: list[int] = []
    batch, start = from_history(
        log.batch_ids, lambda b: reads.append(b) or log.read(b), log.initial_offsets, 8 * MINUTE
    )
    assert batch.batch_id == 12 and start == [kafka(110, 55)], "batch 12 starts where batch 11 ended"
    assert len(reads) <= 4, "a binary search, not a scan of the log"

    found = plan(log)
    assert found.start is not None and found.start.found == HISTORY
    assert found.start.offsets == [kafka(110, 55)] and found.start.watermark_ms == 7 * MINUTE
    assert found.start.floor_ms == 10 * MINUTE and found.start.records == (900 - 110) + (800 - 55)
    assert found.start.seed == {"offsets": [kafka(110, 55)], "watermark_ms": 7 * MINUTE}
    assert "replays 1535 records" in found.reason and "batch 12" in found.reason


def test_a_replay_to_a_shorter_watermark_delay_starts_earlier_by_the_difference(tmp_path: Path) -> None:
    """The offset log bounds what a batch read by the OLD version's watermark plus ITS delay: a new version with a
    shorter delay (same horizon less its delay) needs records the new horizon alone would skip. The start honours
    the larger delay; a version without exactly one watermark cannot be replayed to."""
    watermarks = {10: 5, 11: 6, 12: 7, 13: 8, 14: 9, 15: 10}
    log = write_log(tmp_path, {b: (w * MINUTE, kafka(b * 10, b * 5)) for b, w in watermarks.items()})
    one = {"watermarks": [{"column": "event_time", "delay_ms": 2 * MINUTE}], "stateful": [], "gate_is_window_end": True}
    short = {**one, "watermarks": [{"column": "event_time", "delay_ms": MINUTE // 2}]}
    wider = delay_difference(one, short)
    assert wider == 2 * MINUTE - MINUTE // 2 and delay_difference(short, one) == 0
    found = plan(log, wider_ms=wider)
    assert found.start is not None and found.start.cutoff_ms == 10 * MINUTE - 2 * MINUTE - wider
    assert found.start.watermark_ms == 6 * MINUTE, "batch 11 (watermark 6 min) is the latest before 6.5 min"
    assert plan(log).start.watermark_ms == 7 * MINUTE, "with equal delays: batch 12, as before"  # type: ignore[union-attr]
    assert "2 event-time watermarks" in str(delay_difference(one, {**one, "watermarks": one["watermarks"] * 2}))
    assert "plan is not known" in str(delay_difference(None, one))


def test_a_young_query_replays_from_its_initial_positions(tmp_path: Path) -> None:
    log = write_log(tmp_path, {0: (0, kafka(40, 30)), 1: (9 * MINUTE, kafka(80, 60))}, initial=kafka(3, 0))
    found = plan(log)
    assert found.start is not None and found.start.offsets == [kafka(3, 0)] and found.start.watermark_ms == 0


def test_without_history_the_broker_timestamps_with_the_margin_and_a_check_of_what_green_read(tmp_path: Path) -> None:
    log = write_log(tmp_path, {14: (9 * MINUTE, kafka(140, 70)), 15: (10 * MINUTE, kafka(150, 75))})
    asked: list[tuple[list[tuple[str, int]], int]] = []

    def by_time(partitions: list[tuple[str, int]], at: int) -> dict[tuple[str, int], int]:
        asked.append((partitions, at))
        return {(TOPIC, 0): 120, (TOPIC, 1): 60}

    found = plan(log, by_time=by_time)
    assert asked == [([(TOPIC, 0), (TOPIC, 1)], 10 * MINUTE - 2 * MINUTE - MINUTE)], "W - horizon - margin"
    start = found.start
    assert start is not None and start.found == TIMESTAMPS and start.offsets == [kafka(120, 60)]
    assert start.boundary == [kafka(119, 59)], "one record earlier in each partition holding records before"
    assert start.seed is not None and start.seed["boundary"] == start.boundary
    assert check_first_batch(start, None) is None, "nothing read yet"
    # batch 0 reads the last record before the start of each partition: the newest of them is what counts, so one
    # partition's late boundary record is caught even where another's early one keeps the batch's minimum low
    assert check_first_batch(start, rows(0, 5 * MINUTE, 7 * MINUTE)) is None, "older than it must cover"
    late = check_first_batch(start, rows(0, 5 * MINUTE, 8 * MINUTE + 1))
    assert late is not None and "the last records before its start" in late and "raise the replay margin" in late
    no_boundary = ReplayStart.of({**start.to_dict(), "boundary": None})  # its first rows' minimum instead
    assert check_first_batch(no_boundary, rows(3, 5 * MINUTE, 9 * MINUTE)) is None
    assert check_first_batch(no_boundary, rows(3, 8 * MINUTE + 1, 9 * MINUTE)) is not None
    history = ReplayStart.of({**start.to_dict(), "found": HISTORY})
    assert check_first_batch(history, rows(0, 9 * MINUTE, 9 * MINUTE)) is None, "exact: nothing to check"

    from_zero = plan(log, by_time=lambda partitions, at: {(TOPIC, 0): 0, (TOPIC, 1): 60}).start
    assert from_zero is not None and from_zero.boundary == [kafka(0, 59)], "nothing before offset 0: no boundary"


def rows(batch: int, first_ms: int, last_ms: int) -> dict[str, Any]:
    """The runtime's first_rows: the first batch that read rows, its event times."""
    iso = [datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z") for ms in (first_ms, last_ms)]
    return {"batch": batch, "min": iso[0], "max": iso[1]}


def test_records_retention_deleted_make_replay_impossible_naming_them(tmp_path: Path) -> None:
    batches = {11: (6 * MINUTE, kafka(110, 60)), 12: (7 * MINUTE, kafka(120, 62)), 13: (8 * MINUTE, kafka(130, 65))}
    log = write_log(tmp_path, batches)
    found = plan(log, watermarks=held((0, 1000), (100, 1000)))  # partition 1 starts at 100 now: 60..99 are gone
    assert found.start is None
    assert "events-1: the replay starts at offset 60, but the broker's earliest offset is 100: 40 records are gone" in (
        found.reason
    )
    assert "retention" in found.reason and "migrate" in found.reason


def test_unbounded_state_replays_only_a_topic_that_holds_everything() -> None:
    whole = plan(None, horizon_ms=None)
    assert whole.start is not None and whole.start.found == TOPIC_START and whole.start.offsets == [kafka(0, 0)]
    trimmed = plan(None, horizon_ms=None, watermarks=held((5, 1000), (0, 1000)))
    assert trimmed.start is None and "events-0 starts at offset 5" in trimmed.reason
    assert "state_horizon" in trimmed.reason


def file_source_log(checkpoint: Path, compacted_through: int, after: int) -> list[str]:
    """A file source's log as Spark writes it: `9.compact` holding log ids 0..9, then one file a log id up to
    `after`, each taking in one file (modified at its log id's minute); the files' URIs by log id."""
    directory = checkpoint / "sources" / "0"
    directory.mkdir(parents=True, exist_ok=True)
    uris = [f"file:///input/events-{i:03d}.json" for i in range(after + 1)]

    def entry(i: int) -> str:
        return json.dumps({"path": uris[i], "timestamp": i * MINUTE, "batchId": i}, separators=(",", ":"))

    (directory / f"{compacted_through}.compact").write_text("v1\n" + "\n".join(entry(i) for i in range(10)))
    for i in range(compacted_through + 1, after + 1):
        (directory / str(i)).write_text(f"v1\n{entry(i)}")
        (directory / f".{i}.crc").write_bytes(b"crc")  # Hadoop's checksums beside them are no log files
    return uris


def test_a_file_source_replays_the_files_since_the_batch_its_start_lies_in(tmp_path: Path) -> None:
    # the query read log id b in batch b; the horizon (8 min) lies between batches 12 and 13
    log = write_log(tmp_path, {b: (w * MINUTE, f'{{"logOffset":{b}}}') for b, w in {11: 6, 12: 7, 13: 8}.items()})
    uris = file_source_log(tmp_path, 9, 13)
    found = plan(log, snapshot_sources=positions(1, ['{"logOffset":13}']), watermarks=None)
    start = found.start
    assert start is not None and start.found == HISTORY and start.watermark_ms == 7 * MINUTE
    assert start.files == {"0": {"checkpoint": log.storage.uri, "through": 11}}, "batch 12 began after log id 11"
    assert start.seed == {"offsets": ['{"logOffset":0}'], "watermark_ms": 7 * MINUTE, "files": start.files}
    assert "12 files skipped, 2 read again" in start.note and "batch 12" in found.reason
    asked: list[list[str]] = []
    gone = plan(
        log,
        snapshot_sources=positions(1, ['{"logOffset":13}']),
        watermarks=None,
        missing_files=lambda uris: asked.append(uris) or uris[-1:],
    )
    assert asked == [uris[12:]], "only the files to read again are looked for"
    assert gone.start is None and f"1 of them are gone from the input ({uris[13]})" in gone.reason

    logged = file_log.log_entries(log.storage, "0")
    assert [e["path"] for e in logged] == uris, "the compact file and the files after it, in order"
    skipped = file_log.seen(logged, through=11)
    seeded = [json.loads(line) for line in file_log.seen_log(skipped).decode().split("\n")[1:]]
    assert [e["path"] for e in seeded] == uris[:12] and {e["batchId"] for e in seeded} == {file_log.SEEN_BEFORE_START}

    # Spark keeps the newest 100 offset files: when they begin after the horizon, by the files' modification times
    late = write_log(tmp_path / "late", {13: (8 * MINUTE, '{"logOffset":13}'), 14: (9 * MINUTE, '{"logOffset":14}')})
    file_source_log(tmp_path / "late", 9, 14)
    by_time = plan(late, snapshot_sources=positions(1, ['{"logOffset":14}']), watermarks=None).start
    assert by_time is not None and by_time.found == TIMESTAMPS and by_time.watermark_ms == 8 * MINUTE
    assert by_time.files == {"0": {"checkpoint": late.storage.uri, "before_ms": 7 * MINUTE}}, "W - horizon - margin"
    assert "7 files skipped, 8 read again" in by_time.note
    assert check_first_batch(by_time, rows(1, 8 * MINUTE + 1, 9 * MINUTE)) is not None, "checked as Kafka's are"


def test_a_file_source_without_a_horizon_or_its_log_reads_every_file_and_other_sources_not_at_all() -> None:
    files = plan(None, snapshot_sources=positions(1, ['{"logOffset":7}']), watermarks=None)
    assert files.start is not None and files.start.found == FILES and files.start.seed is None
    assert "every file" in files.reason and "checkpoint is gone" in files.reason
    unbounded = plan(None, snapshot_sources=positions(1, ['{"logOffset":7}']), horizon_ms=None).start
    assert unbounded is not None and unbounded.seed is None
    mixed = plan(None, snapshot_sources=positions(1, [kafka(1, 1), "42"]))
    assert mixed.start is None and "only Kafka sources" in mixed.reason
    assert plan(None, watermarks=None).start is None, "no broker to check the positions against"


STATE = "Spark refused the state: [STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] ..."


@pytest.mark.parametrize(
    ("changes", "mode"),
    [
        ({"migrate": "jobs.m:f", "kafka_only": True}, Mode.MIGRATE),  # declared: migrate first
        ({}, Mode.REPLAY),  # else replay
        ({"migrate": "jobs.m:f", "kafka_only": False}, Mode.REPLAY),  # a file source cannot be started at positions
    ],
)
def test_a_state_change_migrates_where_declared_else_replays(changes: dict[str, Any], mode: Mode) -> None:
    chosen = decide(None, seen(state_problem=STATE, replay_reason="replays 10 records", **changes))
    assert chosen.mode is mode
    assert "cannot take over the old state" in chosen.reasons[Mode.BLUE_GREEN]
    assert "cannot take over the old state" in chosen.reasons[Mode.STOP_RESTORE]
    assert decide("stop_restore", seen(state_problem=STATE)).mode is None


def test_blocked_says_what_would_unblock_it() -> None:
    chosen = decide(None, seen(state_problem=STATE, replay="the broker's earliest offset is 100: raise retention"))
    assert chosen.mode is None and chosen.blocked is not None
    assert "raise retention" in chosen.blocked and "declares no migration function" in chosen.blocked
    gated = decide(None, seen(state_problem=STATE, new_gate={"not_gated": "its sink is FileSink[/out]"}))
    assert gated.mode is None and "its sink is FileSink[/out]" in str(gated.blocked)


def test_replay_and_migrate_can_be_asked_for_on_a_compatible_state_too() -> None:
    assert decide("replay", seen(replay_reason="replays 5 records")).mode is Mode.REPLAY
    assert decide(None, seen()).mode is Mode.BLUE_GREEN, "auto keeps the state where it can"
    refused = decide("migrate", seen())
    assert refused.mode is None and "declares no migration function" in str(refused.blocked)


def test_a_transform_with_state_writes_its_own_windows_and_its_gate_column_is_trusted() -> None:
    """A migration's new version is a transformWithState (only it takes an initial state), and so is the running
    version after such an upgrade: its code, not its plan, says what a window is, so its declared gate column is
    trusted; it still needs one watermark. flatMapGroupsWithState and the rest of what a plan cannot split stay
    refused."""
    own = {"watermarks": [{"column": "event_time", "delay_ms": 60_000}], "stateful": [], "gate_is_window_end": False}
    own["stateful"] = ["arbitrary state (TransformWithStateInPySpark)"]
    migrating = {"state_problem": STATE, "migrate": "jobs.m:f", "kafka_only": True}
    chosen = decide(None, seen(**migrating, new_shape=own))
    assert chosen.mode is Mode.MIGRATE, chosen.reasons
    assert decide("replay", seen(**migrating, old_shape=own)).mode is Mode.REPLAY, "from a migrated version"
    two = {**own, "watermarks": own["watermarks"] * 2}
    refused = decide("migrate", seen(**migrating, new_shape=two))
    assert refused.mode is None and "2 event-time watermarks" in str(refused.blocked)
    pandas = {**own, "stateful": ["arbitrary state (FlatMapGroupsInPandasWithState)"]}
    with_pandas = decide("migrate", seen(**migrating, new_shape=pandas))
    assert "holds arbitrary state (FlatMapGroupsInPandasWithState)" in str(with_pandas.blocked)
    sessions = {**own, "stateful": ["session window aggregation"]}
    from_sessions = decide("migrate", seen(**migrating, old_shape=sessions))
    assert from_sessions.mode is None and "the running version holds a session window" in str(from_sessions.blocked)
