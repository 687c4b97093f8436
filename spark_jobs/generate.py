"""Deterministic event generator for the windowed example jobs (spark_jobs/jobs/windowed).

    python -m spark_jobs.generate --input DIR --events N --round R [--seed S] [--users U] [--json]
    python -m spark_jobs.generate --input DIR --round R --flush

Every call writes ONE new file `DIR/events-r<R>-s<S>.json` (JSON lines) and never rewrites one: the file
source remembers file names, so a rewritten file would be skipped or read twice. The file is written
to a dot-temp name first and then renamed, so the file source (which ignores dot files) never sees half
a file. The events of a round follow from (seed, round) alone, so a test can recompute what it fed.

Round R covers event time [T0 + R * ROUND_SPAN, T0 + (R + 1) * ROUND_SPAN). Feed rounds in increasing
order: the jobs' watermark trails the newest event by one window, so a round older than the previous
one would arrive late and be dropped.

`--flush` writes the flush marker instead: one event of user FLUSH_USER far in the future. It moves the
watermark past every real window, so the jobs emit all of them; the marker's own window never closes
and is never emitted (so it is not counted). Nothing may be fed after a flush.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

T0 = datetime(2025, 1, 1, tzinfo=UTC)
ROUND_SPAN = timedelta(minutes=5)
FLUSH_USER = "__flush__"
POISON_USER = "poison"  # an ordinary event for every version but `poisoned`, whose batch fails on it
FLUSH_TIME = datetime(2100, 1, 1, tzinfo=UTC)
COUNTRIES = ("DE", "FR", "NL", "PL", "SE")
SEQ_PER_ROUND = 10**9  # seq = round * SEQ_PER_ROUND + i: unique over all rounds


@dataclass(frozen=True)
class Written:
    """What one call wrote: enough for a test to know how many events it fed."""

    path: str
    round: int
    seed: int
    events: int  # real events; the flush marker counts 0
    first_event_time: str | None
    last_event_time: str | None
    flush: bool = False


def iso(moment: datetime) -> str:
    """Millisecond ISO-8601 in UTC with a Z: what Spark's JSON reader parses as a timestamp."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def round_events(round_no: int, count: int, seed: int = 0, users: int = 10) -> list[dict[str, object]]:
    """The events of one round: a pure function of (seed, round, count, users)."""
    if round_no < 0 or count < 0 or users < 1:
        raise ValueError("round and events must be >= 0 and users >= 1")
    rng = random.Random(f"{seed}:{round_no}")
    start = T0 + round_no * ROUND_SPAN
    span_ms = int(ROUND_SPAN.total_seconds() * 1000)
    events = []
    for i in range(count):
        moment = start + timedelta(milliseconds=rng.randrange(span_ms))
        events.append(
            {
                "user": f"u{rng.randrange(users):02d}",
                "country": rng.choice(COUNTRIES),
                "event_time": iso(moment),
                "seq": round_no * SEQ_PER_ROUND + i,
            }
        )
    return events


def flush_event(round_no: int) -> dict[str, object]:
    """The marker: valid in every version (non-null fields, seq >= 0), far in the future."""
    seq = round_no * SEQ_PER_ROUND + SEQ_PER_ROUND - 1
    return {"user": FLUSH_USER, "country": "--", "event_time": iso(FLUSH_TIME), "seq": seq}


def _write_atomically(path: Path, lines: list[str]) -> None:
    """Dot-temp file, fsync, rename: a reader sees no file or the whole file."""
    if path.exists():
        raise FileExistsError(f"{path} exists: every round is written once (use a new --round or --seed)")
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as handle:
        handle.write("".join(line + "\n" for line in lines))
        handle.flush()
        os.fsync(handle.fileno())
    tmp.rename(path)


def write_round(input_dir: Path, round_no: int, count: int, seed: int = 0, users: int = 10) -> Written:
    """Write round `round_no` as one new file in `input_dir` and say what was written."""
    input_dir.mkdir(parents=True, exist_ok=True)
    events = round_events(round_no, count, seed, users)
    path = input_dir / f"events-r{round_no:05d}-s{seed}.json"
    _write_atomically(path, [json.dumps(e, separators=(",", ":")) for e in events])
    times = sorted(str(e["event_time"]) for e in events)
    return Written(str(path), round_no, seed, len(events), times[0] if times else None, times[-1] if times else None)


def write_flush(input_dir: Path, round_no: int) -> Written:
    """Write the flush marker (see the module docstring) as one new file."""
    input_dir.mkdir(parents=True, exist_ok=True)
    event = flush_event(round_no)
    path = input_dir / f"events-r{round_no:05d}-flush.json"
    _write_atomically(path, [json.dumps(event, separators=(",", ":"))])
    return Written(str(path), round_no, 0, 0, str(event["event_time"]), str(event["event_time"]), flush=True)


def poison_event(round_no: int) -> dict[str, object]:
    """One ordinary event of POISON_USER in round `round_no`'s time span: it counts like any event, and the
    `poisoned` versions of the example jobs fail the batch that reads it."""
    return {**round_events(round_no, 1)[0], "user": POISON_USER}


def write_poison(input_dir: Path, round_no: int) -> Written:
    """The poison event (poison_event) of round `round_no`, as one new file."""
    input_dir.mkdir(parents=True, exist_ok=True)
    event = poison_event(round_no)
    path = input_dir / f"events-r{round_no:05d}-poison.json"
    _write_atomically(path, [json.dumps(event, separators=(",", ":"))])
    return Written(str(path), round_no, 0, 1, str(event["event_time"]), str(event["event_time"]))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, type=Path, help="the jobs' input directory")
    parser.add_argument("--round", required=True, type=int, help="round number: fixes the event-time range")
    parser.add_argument("--events", type=int, default=0, help="how many events (or --flush)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--flush", action="store_true", help="write the flush marker that closes every window")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.flush == bool(args.events):
        print("give --events N (N > 0) or --flush, not both", file=sys.stderr)
        return 2
    try:
        if args.flush:
            written = write_flush(args.input, args.round)
        else:
            written = write_round(args.input, args.round, args.events, args.seed, args.users)
    except (FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(written)))
    elif written.flush:
        print(f"wrote the flush marker to {written.path}: event time {written.first_event_time} (counts 0 events)")
    else:
        print(
            f"wrote {written.events} events (round {written.round}, seed {written.seed}) to {written.path}: "
            f"event time {written.first_event_time} .. {written.last_event_time}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
