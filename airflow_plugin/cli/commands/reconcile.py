"""`savepoints apply`: the jobs file's declared state made so (core/reconcile/), once; the reconcile DAG runs it on
a schedule."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.errors import InvalidInput
from ...core.jobs.context import Context
from ...core.reconcile.apply import Applied, apply, retry, set_pause
from ..options import add_job
from ..render import Output, say


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "apply",
        parents=[common],
        help="make each job with `desired` in the jobs file run as declared: deploy, restart after a failure, "
        "upgrade to the declared version, stop",
        description="Observe every job the jobs file declares a `desired` state for (or the JOBs named), plan one "
        "step each (nothing, deploy, restart from the latest state after a failure, upgrade, stop with a "
        "savepoint, or hold for a person) and carry it out under the job's lease. --dry-run prints the plan only.",
    )
    add_job(parser, "only these jobs (default: every declared job)", many=True)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--dry-run", action="store_true", help="print each job's step, change nothing")
    what.add_argument("--pause", action="store_true", help="a person takes the JOBs over: apply leaves them alone")
    what.add_argument("--resume", action="store_true", help="give paused JOBs back to apply")
    what.add_argument(
        "--retry",
        action="store_true",
        help="try again what apply holds for the JOBs (a version that failed, a spent restart budget, a refusal "
        "repeated), and apply them now",
    )
    parser.set_defaults(run=run_apply)


def run_apply(args: argparse.Namespace, ctx: Context) -> Output:
    if (args.pause or args.resume or args.retry) and not args.job:
        raise InvalidInput("--pause, --resume and --retry act on the JOBs named: name at least one")
    if args.pause or args.resume:
        changed = [set_pause(ctx.job(name), paused=args.pause) for name in args.job]
        verb = "paused" if args.pause else "resumed: the next `savepoints apply` (the reconcile DAG) looks after it"

        def human() -> None:
            for record in changed:
                say(f"{record.job}: {verb}")

        return Output({"jobs": [r.to_dict() for r in changed]}, human)
    retried = [retry(ctx.job(name)) for name in args.job] if args.retry else []
    if not args.json:
        for record in retried:  # then the step it now allows, carried out in this same run
            say(f"{record.job}: retried: held versions released, the restart budget counts from now")
    applied = apply(ctx, args.job or None, dry_run=args.dry_run, on_job=None if args.json else _say)
    failed = next((a.error for a in applied if a.error is not None), None)
    shown = {"jobs": [a.to_dict() for a in applied]} | ({"retried": [r.to_dict() for r in retried]} if retried else {})
    return Output(shown, lambda: None, error=failed)


def _say(applied: Applied) -> None:
    step = applied.step
    say(f"{step.job}: {step.action} - {step.reason}")
    if not applied.ok:
        say(f"  FAILED: {applied.outcome}")
    elif step.action.acts:
        say(f"  {applied.outcome}")
