"""The command line every managed job accepts. The launcher (engine) passes the common options; anything
it does not know goes to the job's own `build` function, unchanged and in order.

    <app.py> --store URI --job NAME --deployment ID --checkpoint LOCATION
             --trigger-interval "2 seconds" | available-now
             --delivery at-most-once | at-least-once | exactly-once
             [--heartbeat-interval SECONDS] [--poll-interval SECONDS]
             [--preflight SCHEMA_PROBE_LOCATION] [--standby]
             [--gate-staging LOCATION] [--gate-after MS] [--gate-until MS]
             [--seed JSON] [--initial-state URI] [--migration JSON]
             <job-specific args>

The hidden options are the engine's: --preflight, --standby and --gate-* (see RuntimeArgs); --seed (a start at
given Kafka positions and watermark: seed.py), --initial-state (a transformWithState's initial state: initial.py)
and --migration (the migration run of an upgrade: migration.py).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from .delivery import Delivery
from .seed import MigrationRequest, Seed

AVAILABLE_NOW = "available-now"
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
}


@dataclass(frozen=True)
class Trigger:
    """A processing-time interval (the checkpoint interval) or available-now (process what is there, end)."""

    spec: str  # as given, e.g. "2 seconds"
    seconds: float | None  # None for available-now

    @property
    def available_now(self) -> bool:
        return self.seconds is None

    def spark_kwargs(self) -> dict[str, object]:
        """Keyword arguments for DataStreamWriter.trigger."""
        if self.available_now:
            return {"availableNow": True}
        return {"processingTime": f"{round(self.seconds * 1000)} milliseconds"}


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds of '2 seconds', '500 ms', '1 minute', '1.5 hours'; ArgumentTypeError naming
    `what` otherwise. The one parser of the runtime's durations: trigger intervals, a job's state horizon."""
    match = _INTERVAL.match(text)
    if not match or match.group(2).lower() not in _UNIT_SECONDS:
        raise argparse.ArgumentTypeError(f"bad {what} {text!r}: use e.g. '2 seconds', '500 milliseconds', '1 minute'")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]


def parse_trigger(text: str) -> Trigger:
    """'2 seconds', '500 ms', '1 minute' or 'available-now' (also 'availableNow')."""
    if text.strip().lower() in (AVAILABLE_NOW, "availablenow", "available_now"):
        return Trigger(AVAILABLE_NOW, None)
    try:
        seconds = parse_duration(text, "trigger interval")
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} or available-now") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"trigger interval {text!r} must be positive")
    return Trigger(text.strip(), seconds)


@dataclass(frozen=True)
class RuntimeArgs:
    store: str
    job: str
    deployment: str
    checkpoint: str
    trigger: Trigger
    delivery: Delivery
    heartbeat_interval: float  # seconds between status writes when nothing else happens (<= 5)
    poll_interval: float  # seconds between looks at the control channel
    # Pre-flight of an upgrade (core/jobs/preflight.py): re-plan the pending batch once on --checkpoint, then on
    # this copy whose stored state schemas were removed (Spark writes the new version's), into a noop sink.
    preflight_probe: str | None = None
    # A pre-started driver (core/jobs/deploy.py prestart): create the session, report STANDBY, and start the
    # query only when a start request arrives (its checkpoint restored meanwhile); stop requests end it.
    standby: bool = False
    # The gate of a job whose Delta writes the runtime gates (gate.py), as the engine hands it over: green of a
    # blue/green upgrade stages into `gate_staging`; a restore of a gated deployment keeps its interval.
    gate_staging: str | None = None
    gate_after: int | None = None
    gate_until: int | None = None
    # An empty checkpoint started at given Kafka positions and watermark (a replay's or a migration's green,
    # seed.py); applied only while the checkpoint has no offsets, so a restarted green continues
    seed: Seed | None = None
    # The Parquet directory a migration wrote: what `initial_state(spark)` gives the job's build (initial.py)
    initial_state: str | None = None
    # A migration run (migration.py): instead of running the job, make and check the new version's initial state
    migration: MigrationRequest | None = None


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return value


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a job's own --in must not be taken for our --interval-something
    parser = argparse.ArgumentParser(prog="<application>", allow_abbrev=False, add_help=False)
    parser.add_argument("--store", required=True, help="snapshot store URI (local path or s3://bucket/prefix)")
    parser.add_argument("--job", required=True)
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--checkpoint", required=True, help="this deployment's own checkpoint location")
    parser.add_argument("--trigger-interval", required=True, type=parse_trigger)
    parser.add_argument("--delivery", required=True, type=Delivery, choices=list(Delivery))
    parser.add_argument("--heartbeat-interval", type=_positive, default=2.0)
    parser.add_argument("--poll-interval", type=_positive, default=1.0)
    parser.add_argument("--preflight", dest="preflight_probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gate-staging", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gate-after", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gate-until", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=Seed.from_json, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--initial-state", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--migration", type=MigrationRequest.from_json, default=None, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str]) -> tuple[RuntimeArgs, list[str]]:
    """The runtime's options and the rest (the job's), in their original order."""
    known, rest = _parser().parse_known_args(argv)
    if known.heartbeat_interval > 5:
        _parser().error("--heartbeat-interval must be at most 5 seconds (the status must stay fresh)")
    runtime = RuntimeArgs(
        store=known.store,
        job=known.job,
        deployment=known.deployment,
        checkpoint=known.checkpoint,
        trigger=known.trigger_interval,
        delivery=known.delivery,
        heartbeat_interval=known.heartbeat_interval,
        poll_interval=known.poll_interval,
        preflight_probe=known.preflight_probe,
        standby=known.standby,
        gate_staging=known.gate_staging,
        gate_after=known.gate_after,
        gate_until=known.gate_until,
        seed=known.seed,
        initial_state=known.initial_state,
        migration=known.migration,
    )
    return runtime, rest
