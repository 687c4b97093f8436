"""`savepoints upgrade`: upgrade a running job to another version (blue/green or stop/restore), resume one
whose process died, cancel one, and show what they did. The same steps as the upgrade DAG's (core/upgrades)."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.durations import duration_argument, format_duration
from ...core.errors import InvalidInput
from ...core.jobs.context import Context
from ...core.reconcile.scaling import rescale_sizes, upgrade_title
from ...core.upgrades.record import Mode, Upgrade, Upgrades
from ...core.upgrades.run import AUTO, begin, cancel, current, outcome, run_upgrade
from ...core.upgrades.steps import UpgradeSettings
from ..options import add_concurrency_option, add_job, add_kafka_option
from ..render import Output, key_values, out, say


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    upgrade_cmd = commands.add_parser(
        "upgrade",
        parents=[common],
        help="upgrade a running job to another version: blue/green (no gap) or stop/restore, with rollback",
        description="Upgrade the running deployment of JOB to --version: a live savepoint, the pre-flight (which "
        "also decides the mode), then blue/green (the new version beside the old one, an exactly-once cutover at a "
        "window boundary) or stop/restore (stop with a savepoint, start the new version from it), a health gate, "
        "and an abort or rollback on failure. Ends with exit 0 when the new version runs healthy.",
    )
    add_job(upgrade_cmd, "the job, as the jobs file declares it")
    action = upgrade_cmd.add_mutually_exclusive_group(required=True)
    action.add_argument("--version", help="the new version, declared in the jobs file")
    action.add_argument("--resume", action="store_true", help="continue the job's unfinished upgrade")
    action.add_argument(
        "--abort",
        action="store_true",
        help="cancel the unfinished upgrade (before its cutover: abort; after: roll back); a FAILED one: try its "
        "recovery again; an ended one: take back what it left in running deployments (a gate), idempotently",
    )
    action.add_argument(
        "--show", metavar="ID", nargs="?", const="", help="show an upgrade's record (default: the newest)"
    )
    upgrade_cmd.add_argument(
        "--mode",
        choices=[AUTO, *(m.value for m in Mode)],
        default=AUTO,
        help="auto (default): the pre-flight's choice: blue_green where it applies, else stop_restore; when the new "
        "version cannot take over the old state: migrate where the version declares a migration function, else replay",
    )
    defaults = UpgradeSettings()
    upgrade_cmd.add_argument("--min-batches", type=int, default=defaults.min_batches, help="healthy after N batches")
    upgrade_cmd.add_argument(
        "--no-lag-must-fall", action="store_true", help="do not wait for a Kafka job's lag to fall (only batches)"
    )
    upgrade_cmd.add_argument("--allow-renames", action="store_true", help="accept state field renames")
    upgrade_cmd.add_argument("--accept-source-gap", action="store_true", help="accept Kafka records gone since")
    upgrade_cmd.add_argument(
        "--catch-up-timeout",
        type=duration_argument("--catch-up-timeout", bare_unit="s", positive=True),
        default=defaults.catch_up_seconds,
        metavar="DURATION",
        help="blue_green, replay, migrate: how long the new version may take to catch up before the upgrade aborts, "
        f"seconds or a duration such as 30m (default {format_duration(defaults.catch_up_seconds)})",
    )
    upgrade_cmd.add_argument(
        "--start-timeout",
        type=duration_argument("--start-timeout", bare_unit="s", positive=True),
        default=defaults.start_seconds,
        metavar="DURATION",
        help="stop_restore: how long the new version's driver may take to be ready in STANDBY (its Spark session up "
        "and warm) before the upgrade aborts, the old version never stopped "
        f"(default {format_duration(defaults.start_seconds)})",
    )
    upgrade_cmd.add_argument(
        "--answer-timeout",
        type=duration_argument("--answer-timeout", bare_unit="s", positive=True),
        default=defaults.answer_seconds,
        metavar="DURATION",
        help="blue_green, replay, migrate: how long a driver may take to answer a cutover request (gate, publish) "
        "before the upgrade aborts, and an abort waits for a driver to confirm before it is FAILED "
        f"(default {format_duration(defaults.answer_seconds)})",
    )
    upgrade_cmd.add_argument(
        "--replay-margin",
        type=duration_argument("--replay-margin", bare_unit="s"),
        default=defaults.replay_margin_seconds,
        metavar="DURATION",
        help="replay by Kafka timestamps: how much earlier than its event time a record's timestamp may be, seconds "
        f"or a duration such as 5m (default {format_duration(defaults.replay_margin_seconds)})",
    )
    add_kafka_option(upgrade_cmd)
    add_concurrency_option(upgrade_cmd)
    upgrade_cmd.set_defaults(run=run_upgrade_command)


def run_upgrade_command(args: argparse.Namespace, ctx: Context) -> Output:
    job = ctx.job(args.job)
    if args.show is not None:
        upgrades = Upgrades(job.store.storage)
        shown = upgrades.get(job.name, args.show) if args.show else upgrades.newest(job.name)
        if shown is None:
            raise InvalidInput(f"job {job.name} has no upgrades yet")
        return Output(shown.to_dict(), lambda: _show(shown))
    if args.version:
        if args.min_batches < 1:
            raise InvalidInput(f"--min-batches {args.min_batches}: give a positive number")
        settings = UpgradeSettings(
            min_batches=args.min_batches,
            lag_must_fall=not args.no_lag_must_fall,
            allow_renames=args.allow_renames,
            accept_source_gap=args.accept_source_gap,
            catch_up_seconds=args.catch_up_timeout,
            start_seconds=args.start_timeout,
            replay_margin_seconds=args.replay_margin,
            answer_seconds=args.answer_timeout,
        )
        upgrade = begin(job, args.version, mode=args.mode, settings=settings)
    else:
        upgrade = current(job, ended=args.abort)  # --abort: an ended upgrade's leftovers too
        if args.abort:
            upgrade = cancel(job, upgrade)
    say(f"{_title(upgrade)}: {upgrade.phase}")
    upgrade = run_upgrade(job, upgrade, on_step=_step)
    return Output(upgrade.to_dict(), lambda: _show(upgrade), error=_error(upgrade))


def _step(upgrade: Upgrade) -> None:
    note = upgrade.history[-1]["note"] if upgrade.history else ""
    say(f"  {upgrade.phase}: {note}")


def _error(upgrade: Upgrade) -> Exception | None:
    try:
        outcome(upgrade)
    except Exception as exc:  # the outcome's error class decides the exit code
        return exc
    return None


def _title(upgrade: Upgrade) -> str:
    """`upgrade up-1 of orders to v2`, or for the autoscaler's: `rescale 2 -> 4 of orders (v1), upgrade up-1`."""
    if rescale_sizes(upgrade) is None:
        return f"upgrade {upgrade.id} of {upgrade.job} to {upgrade.to_version}"
    return f"{upgrade_title(upgrade)} of {upgrade.job} ({upgrade.to_version}), upgrade {upgrade.id}"


def _show(upgrade: Upgrade) -> None:
    say(_title(upgrade))
    out.print(
        key_values(
            {
                "upgrade": upgrade.id,
                "job": upgrade.job,
                "from": f"{upgrade.old_version} ({upgrade.old_deployment})",
                "to": f"{upgrade.to_version} ({upgrade.new_deployment or '-'})",
                "mode": upgrade.mode or f"(asked: {upgrade.requested_mode or 'the pre-flight decides'})",
                "phase": str(upgrade.phase),
                "savepoint": upgrade.savepoint,
                "replay": (upgrade.replay or {}).get("note"),
                "migration": (upgrade.migration or {}).get("reason"),
                "cutover": upgrade.cutover_at,
                "stop savepoint": upgrade.stop_savepoint,
                "error": upgrade.error,
            }
        )
    )
    for mode, reason in upgrade.modes.items():
        say(f"  {mode}: {reason}")
    for entry in upgrade.history:
        say(f"  {entry['at']} {entry['phase']}: {entry['note']}")
