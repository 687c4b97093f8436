"""The command line every managed job accepts. The launcher (engine) passes the common options; anything
it does not know goes to the job's own `build` function, unchanged and in order.

    <app.py> --store URI --job NAME --deployment ID --checkpoint LOCATION
             --trigger-interval DURATION | available-now      (e.g. "2 seconds", "500ms", "1 hour")
             --delivery at-most-once | at-least-once | exactly-once
             [--heartbeat-interval SECONDS] [--poll-interval SECONDS]   (plain seconds, or a DURATION)
             [--preflight SCHEMA_PROBE_LOCATION] [--standby]
             [--gate-staging LOCATION] [--gate-after MS] [--gate-until MS]
             [--seed JSON] [--initial-state URI] [--migration JSON] [--fence-interval SECONDS]
             <job-specific args>

A DURATION is the engine's one grammar (airflow_plugin/core/durations.py, the jobs file's too): a number and
ms, s, m, h, d or w, or the unit spelled out ("90 seconds", "2 days").

The hidden options are the engine's: --preflight, --standby and --gate-* (see RuntimeArgs); --seed (a start at
given Kafka positions and watermark: seed.py), --initial-state (a transformWithState's initial state: initial.py)
and --migration (the migration run of an upgrade: migration.py); --fence-interval (a deployment's driver: how long
its fence holds after each read of the job's writers record: fence.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from airflow_plugin.core.durations import duration_argument

from .delivery import Delivery
from .seed import MigrationRequest, Seed

AVAILABLE_NOW = "available-now"


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
        # whole milliseconds, a form Spark reads whatever the interval was written as ("1 hour", "2d");
        # at least 1: Spark takes 0 for "as fast as possible", which no positive interval means
        return {"processingTime": f"{max(1, round(self.seconds * 1000))} milliseconds"}


def parse_duration(text: str, what: str = "duration", *, positive: bool = False) -> float:
    """Seconds of '2 seconds', '500 ms', '1 minute', '1.5 hours', '2 days': the engine's one grammar
    (airflow_plugin/core/durations.py), the jobs file's too; ArgumentTypeError naming `what` otherwise. The
    runtime's durations: trigger intervals, a job's state horizon."""
    return duration_argument(what, positive=positive)(text)


def parse_trigger(text: str) -> Trigger:
    """'2 seconds', '500 ms', '1 minute', '1 hour' or 'available-now' (also 'availableNow')."""
    if text.strip().lower() in (AVAILABLE_NOW, "availablenow", "available_now"):
        return Trigger(AVAILABLE_NOW, None)
    try:
        seconds = parse_duration(text, "trigger interval", positive=True)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; or available-now") from None
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
    # Pre-flight of an upgrade (core/upgrades/preflight.py): re-plan the pending batch once on --checkpoint, then on
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
    # A deployment's driver: how long its fence holds after a read of the job's writers record (fence.py); None:
    # not fenced (a pre-flight, a migration run, a driver started by hand)
    fence_interval: float | None = None


def seconds_option(option: str) -> Callable[[str], float]:
    """The argparse type of an option that is a length of time: a plain number of seconds ("2", as the engine
    passes it) or a duration of the one grammar ("500 ms"), positive."""
    return duration_argument(option, bare_unit="s", positive=True)


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a job's own --in must not be taken for our --interval-something
    parser = argparse.ArgumentParser(prog="<application>", allow_abbrev=False, add_help=False)
    parser.add_argument("--store", required=True, help="snapshot store URI (local path or s3://bucket/prefix)")
    parser.add_argument("--job", required=True)
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--checkpoint", required=True, help="this deployment's own checkpoint location")
    parser.add_argument("--trigger-interval", required=True, type=parse_trigger)
    parser.add_argument("--delivery", required=True, type=Delivery, choices=list(Delivery))
    parser.add_argument("--heartbeat-interval", type=seconds_option("--heartbeat-interval"), default=2.0)
    parser.add_argument("--poll-interval", type=seconds_option("--poll-interval"), default=1.0)
    parser.add_argument("--preflight", dest="preflight_probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gate-staging", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gate-after", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gate-until", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=Seed.from_json, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--initial-state", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--migration", type=MigrationRequest.from_json, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--fence-interval", type=seconds_option("--fence-interval"), default=None, help=argparse.SUPPRESS
    )
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
        fence_interval=known.fence_interval,
    )
    return runtime, rest
