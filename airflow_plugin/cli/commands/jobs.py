"""Managed jobs: deploy, status, a savepoint now, stop, kill, and the pre-flight of an upgrade."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.durations import duration_argument
from ...core.errors import InvalidInput
from ...core.jobs.context import Context
from ...core.jobs.deploy import RESTORE_HELP, DeployRequest, deploy
from ...core.jobs.deployments import describe
from ...core.jobs.observe import observe_deployment
from ...core.jobs.savepoint import take_savepoint
from ...core.jobs.spec import DEFAULT_RESTORE, RESTORE_MODES
from ...core.jobs.stop import job_status, kill, stop
from ...core.lease import LeaseRecord, break_lease, held_leases, read_lease
from ...core.parallel import map_parallel
from ...core.reconcile.apply import declared_status, describe_declared
from ...core.records.manifest import parse_labels
from ...core.upgrades.preflight import preflight
from ..options import add_concurrency_option, add_job, add_kafka_option
from ..render import Output, out, say, status_table
from .snapshots import ACCEPT_GAP_HELP, LABEL_HELP, REWIND_SINK_HELP

RECENT_RETIRED = 3  # retired deployments `savepoints status` shows per job (the newest), besides the others


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    deploy_cmd = commands.add_parser("deploy", parents=[common], help="launch a job version as a new deployment")
    add_job(deploy_cmd, "the job, as the jobs file declares it")
    deploy_cmd.add_argument("--version", help="a version declared in the jobs file (default: its default_version)")
    deploy_cmd.add_argument(
        "--restore",
        default=DEFAULT_RESTORE,
        metavar="|".join([*RESTORE_MODES, "ID"]),
        help=f"where the state comes from: {RESTORE_HELP}",
    )
    deploy_cmd.add_argument(
        "--partitions", type=int, help="state partitions; differing from the snapshot's rescales its state first"
    )
    deploy_cmd.add_argument("--rewind-sink", action="store_true", help=REWIND_SINK_HELP)
    deploy_cmd.add_argument("--accept-source-gap", action="store_true", help=ACCEPT_GAP_HELP)
    deploy_cmd.add_argument(
        "--wait",
        metavar="DURATION",
        type=duration_argument("--wait", bare_unit="s"),
        default=180,
        help="how long to wait for RUNNING: seconds or a duration such as 5m (default 180)",
    )
    deploy_cmd.add_argument(
        "--spark-conn", metavar="CONN_ID", help="build spark-submit from this Airflow connection (the [airflow] extra)"
    )
    add_kafka_option(deploy_cmd)
    add_concurrency_option(deploy_cmd)
    deploy_cmd.set_defaults(run=run_deploy)

    preflight_cmd = commands.add_parser(
        "preflight", parents=[common], help="would this version run on that snapshot's state? (touches nothing live)"
    )
    add_job(preflight_cmd, "the job, as the jobs file declares it")
    preflight_cmd.add_argument("--version", required=True, help="the new version, declared in the jobs file")
    preflight_cmd.add_argument("--snapshot", default="latest", help="snapshot id (default: latest)")
    preflight_cmd.add_argument(
        "--allow-renames", action="store_true", help="accept state field renames (Spark does not check names)"
    )
    preflight_cmd.add_argument("--accept-source-gap", action="store_true", help=ACCEPT_GAP_HELP)
    add_kafka_option(preflight_cmd)
    preflight_cmd.set_defaults(run=run_preflight)

    status_cmd = commands.add_parser("status", parents=[common], help="deployments with state and heartbeat")
    add_job(status_cmd, "only this job (default: every job of the jobs file)", optional=True)
    status_cmd.add_argument(
        "--all",
        action="store_true",
        help=f"every retired deployment too (default: the newest {RECENT_RETIRED} of each job besides the others)",
    )
    status_cmd.set_defaults(run=run_status)

    stop_cmd = commands.add_parser("stop", parents=[common], help="stop the running deployment at a batch boundary")
    add_job(stop_cmd, "the job, as the jobs file declares it")
    stop_cmd.add_argument("--savepoint", action="store_true", help="then snapshot the quiescent checkpoint")
    stop_cmd.add_argument("--drain", action="store_true", help="process what is available first")
    stop_cmd.add_argument(
        "--timeout",
        metavar="DURATION",
        type=duration_argument("--timeout", bare_unit="s", positive=True),
        help="seconds or a duration such as 5m (default: trigger interval + 60 seconds)",
    )
    add_concurrency_option(stop_cmd)
    stop_cmd.set_defaults(run=run_stop)

    savepoint_cmd = commands.add_parser(
        "savepoint", parents=[common], help="a savepoint of the running deployment now (it keeps running)"
    )
    add_job(savepoint_cmd, "the job, as the jobs file declares it")
    savepoint_cmd.add_argument("--label", action="append", default=[], metavar="K=V", help=LABEL_HELP)
    savepoint_cmd.add_argument("--pin", action="store_true", help="never delete by retention")
    add_concurrency_option(savepoint_cmd)
    savepoint_cmd.set_defaults(run=run_savepoint)

    kill_cmd = commands.add_parser("kill", parents=[common], help="force-kill a deployment that will not stop")
    add_job(kill_cmd, "the job, as the jobs file declares it")
    kill_cmd.set_defaults(run=run_kill)

    lease_cmd = commands.add_parser("lease", parents=[common], help="the job leases: one operation per job at once")
    lease_cmd.add_argument("action", choices=["list", "break"], help="list held leases, or break one")
    add_job(
        lease_cmd,
        "list: only this job's lease; break: the job whose lease to break (only if its holder is surely dead)",
        optional=True,
    )
    lease_cmd.set_defaults(run=run_lease)


def run_deploy(args: argparse.Namespace, ctx: Context) -> Output:
    job = ctx.job(args.job)
    request = DeployRequest(
        args.version,
        restore=args.restore,
        partitions=args.partitions,
        wait_seconds=args.wait,
        rewind_sink=args.rewind_sink,
        accept_source_gap=args.accept_source_gap,
    )
    deployment = deploy(job, request)
    status, state = observe_deployment(job, deployment)
    return Output(describe(deployment, status, state), lambda: say(deployment.id))


def run_preflight(args: argparse.Namespace, ctx: Context) -> Output:
    job = ctx.job(args.job)
    report = preflight(
        job, args.snapshot, args.version, allow_renames=args.allow_renames, accept_source_gap=args.accept_source_gap
    )

    def human() -> None:
        verdict = "PASSED" if report.passed else "BLOCKED"
        say(f"pre-flight of {job.name} {report.version} on {report.snapshot} (batch {report.batch_id}): {verdict}")
        say(report.reason)
        if report.sources:
            say(f"Kafka offsets: {report.sources['summary']}")
        for change in report.topic_changes:
            say(f"  {change['detail']}")

    return Output(report.to_dict(), human, error=report.blocked())  # refused (exit 4) after the report


def run_status(args: argparse.Namespace, ctx: Context) -> Output:
    """Every job of the jobs file (or one), read in parallel: each job's deployment index, the heartbeats of
    its deployments not retired, and its lease."""
    names = [args.job] if args.job else sorted(ctx.jobs)

    def one(name: str) -> tuple[list[dict[str, Any]], int, LeaseRecord | None, dict[str, Any] | None]:
        job = ctx.job(name)
        rows, hidden = job_status(job, retired=None if args.all else RECENT_RETIRED)
        return rows, hidden, read_lease(job.store.storage, job.name), declared_status(job)

    found = dict(zip(names, map_parallel(one, names), strict=True))
    rows = [row for name in names for row in found[name][0]]
    hidden = sum(found[name][1] for name in names)
    leases = [lease for name in names if (lease := found[name][2])]
    declared = {name: kept for name in names if (kept := found[name][3])}

    def human() -> None:
        out.print(status_table(rows) if rows else "no deployments")
        for row in rows:
            if row.get("unhealthy"):
                say(f"UNHEALTHY: deployment {row['deployment']} of {row['job']}: {row['unhealthy']}")
        for lease in leases:
            say(f"lease: job {lease.job} is held by {lease.describe()}")
        for name, kept in declared.items():
            say(f"declared: {describe_declared(name, kept)}")
        if hidden:
            say(f"{hidden} older retired deployments not shown: --all shows them")

    busy = {lease.job: lease.describe() for lease in leases}
    return Output([row | {"lease": busy.get(row["job"]), "declared": declared.get(row["job"])} for row in rows], human)


def run_lease(args: argparse.Namespace, ctx: Context) -> Output:
    if args.action == "break":
        if not args.job:
            raise InvalidInput("name the job whose lease to break: `savepoints lease break JOB`")
        job = ctx.snapshots_of(args.job)
        broken = break_lease(job.store.storage, job.name)
        shown = broken.describe() if broken else "an unreadable record"
        return Output({"job": job.name, "broken": broken.to_dict() if broken else None}, lambda: say(f"broke {shown}"))
    records = [r for r in held_leases(ctx.store(args.job).storage) if args.job in (None, r.job)]

    def human() -> None:
        for record in records:
            say(f"{record.job}: {record.describe()}")
        if not records:
            say("no leases held")

    return Output([r.to_dict() for r in records], human)


def run_stop(args: argparse.Namespace, ctx: Context) -> Output:
    result = stop(ctx.job(args.job), savepoint=args.savepoint, drain=args.drain, timeout=args.timeout)

    def human() -> None:
        if result.snapshot:
            say(result.snapshot.id)
        else:
            say(f"deployment {result.deployment.id} {result.state} after {result.seconds:.1f}s")

    return Output(result.to_dict(), human)


def run_savepoint(args: argparse.Namespace, ctx: Context) -> Output:
    job = ctx.job(args.job)
    manifest = take_savepoint(job, pin=args.pin, labels=parse_labels(args.label))
    return Output(
        manifest.summary(),
        lambda: say(f"{manifest.id}: savepoint of job {job.name} at batch {manifest.batch_id}, {manifest.status}"),
    )


def run_kill(args: argparse.Namespace, ctx: Context) -> Output:
    job = ctx.job(args.job)
    result = kill(job)
    return Output(
        {"job": job.name, "deployment": result.deployment.id, "state": "FAILED", "killed": str(result.killed)},
        lambda: say(result.said),
    )
