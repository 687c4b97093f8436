"""The `savepoints` command line: the engine for people on call, no Airflow needed.

Exit codes: 0 ok; 1 unexpected error; 2 bad input or usage; 3 not found (job, snapshot, location,
bucket); 4 refused to avoid losing or overwriting data, or an upgrade blocked by its pre-flight; 5 not a
usable checkpoint; 6 integrity problem (checksum mismatch, verify failed, corrupt manifest); 7 store
unreachable or credentials refused; 8 a Spark tool failed (deep verify); 9 a job could not be launched or
failed on start; 10 timed out (a job that does not stop: the request is withdrawn and the job keeps
running)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from .core.create import SnapshotRequest, create_snapshot
from .core.deploy import RESTORE_MODES, DeployRequest, deploy
from .core.errors import InvalidInput, NotFound, SavepointsError
from .core.jobs import JOBS_ENV, JobSpec, get_job, jobs_file, load_jobs
from .core.launcher import default_command
from .core.lifecycle import delete_snapshot, set_pinned
from .core.manifest import Kind, Manifest, Trigger
from .core.preflight import preflight
from .core.prune import prune, retain_checkpoints
from .core.restore import execute_restore, plan_restore
from .core.retention import Plan, RetentionPolicy, parse_policy
from .core.stop import job_status, kill, stop
from .core.storage import open_storage
from .core.store import SnapshotStore
from .core.verify import verify_snapshot

STORE_ENV = "SAVEPOINTS_STORE"
EXIT_VERIFY_FAILED = 6

# Piped output (grep, logs) gets wide lines instead of a table squeezed to 80 columns.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 240)


class BarProgress:
    """A rich progress bar on stderr for long transfers (only on a terminal)."""

    def __init__(self) -> None:
        self._bar: Progress | None = None
        self._task: Any = None
        self._lock = threading.Lock()

    def start(self, description: str, total_bytes: int, total_files: int) -> None:
        if not err.is_terminal:
            return
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(f"{description} ({total_files} files)", total=total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.advance(self._task, nbytes)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds()
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{int(seconds // length)}{unit}"
    return f"{int(seconds)}s"


def _labels(pairs: Sequence[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"invalid label {pair!r}: use --label KEY=VALUE")
        labels[key] = value
    return labels


def _store(args: argparse.Namespace) -> SnapshotStore:
    uri = args.store or os.environ.get(STORE_ENV)
    if not uri:
        raise InvalidInput(f"no snapshot store: pass --store URI or set {STORE_ENV}")
    return SnapshotStore(open_storage(uri))


def _snapshot_table(manifests: Sequence[Manifest]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for column in ("job", "id", "kind", "trigger", "status", "batch", "files", "size", "uploaded", "age", "pin"):
        numeric = column in ("batch", "files", "size", "uploaded")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True)
    for m in manifests:
        table.add_row(
            m.job,
            m.id,
            str(m.kind),
            str(m.trigger),
            str(m.status),
            "-" if m.batch_id is None else str(m.batch_id),
            str(len(m.files)),
            _human_bytes(m.total_bytes),
            _human_bytes(m.uploaded_bytes),
            _age(m.created_at),
            "yes" if m.pinned else "",
        )
    return table


def _emit(args: argparse.Namespace, data: Any, human: Callable[[], None]) -> None:
    if args.json:
        text = json.dumps(data, default=str)
        if out.is_terminal:
            out.print_json(text)
        else:
            print(text)
    else:
        human()


def cmd_create(args: argparse.Namespace) -> int:
    store = _store(args)
    request = SnapshotRequest(
        job=args.job,
        kind=Kind(args.kind),
        trigger=Trigger(args.trigger),
        requested_by=args.requested_by or os.environ.get("USER", ""),
        labels=_labels(args.label),
        pinned=args.pin,
        sinks=tuple(args.sink),
    )
    manifest = create_snapshot(
        store, open_storage(args.checkpoint), request, progress=BarProgress(), concurrency=args.concurrency
    )

    def human() -> None:
        out.print(
            f"snapshot [bold]{manifest.id}[/] of job {manifest.job} {manifest.status} at batch {manifest.batch_id}: "
            f"{len(manifest.files)} files, {_human_bytes(manifest.total_bytes)}, "
            f"{_human_bytes(manifest.uploaded_bytes)} uploaded in {manifest.timings.get('total_s', 0):.1f}s"
        )

    _emit(args, manifest.summary() | {"timings": manifest.timings}, human)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    manifests = _store(args).list(args.job)
    _emit(
        args,
        [m.summary() for m in manifests],
        lambda: out.print(_snapshot_table(manifests) if manifests else "no snapshots"),
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    manifest = _store(args).get(args.job, args.id)
    data = manifest.summary() | {
        "query_id": manifest.query_id,
        "pending_batch_id": manifest.pending_batch_id,
        "watermark_ms": manifest.watermark_ms,
        "source_offsets": manifest.source_offsets,
        "operators": manifest.operators,
        "sinks": manifest.sinks,
        "spark_conf": manifest.spark_conf,
        "restore_conf": manifest.restore_conf,
        "timings": manifest.timings,
        "attempts": manifest.attempts,
        "verification": manifest.verification,
    }

    def human() -> None:
        table = Table(show_header=False, show_edge=False)
        for key, value in data.items():
            table.add_row(key, json.dumps(value) if isinstance(value, dict | list) else str(value))
        out.print(table)

    _emit(args, data, human)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    report = verify_snapshot(
        _store(args), args.job, args.id, deep=args.deep, progress=BarProgress(), concurrency=args.concurrency
    )

    def human() -> None:
        verdict = "[green]OK[/]" if report.ok else "[red]FAILED[/]"
        kind = "deep " if args.deep else ""
        out.print(
            f"{kind}verify of snapshot {report.snapshot} (batch {report.batch_id}): {verdict}, "
            f"{report.files} files, {_human_bytes(report.bytes)} in {report.seconds:.1f}s"
        )
        for problem in report.problems:
            out.print(f"  - {problem}")
        if report.deep:
            for op in report.deep.get("operators", []):
                out.print(
                    f"  operator {op.get('operator')} store {op.get('store')}: {op.get('rows')} rows, "
                    f"partitions {op.get('partitions')}, matches original: {op.get('matches_original')}"
                )

    _emit(args, report.to_dict(), human)
    return 0 if report.ok else EXIT_VERIFY_FAILED


def cmd_delete(args: argparse.Namespace) -> int:
    result = delete_snapshot(_store(args), args.job, args.id, force=args.force)
    _emit(
        args,
        result,
        lambda: out.print(
            f"deleted snapshot {result['snapshot']} of job {args.job} ({result['deleted_blobs']} stored files freed)"
        ),
    )
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    manifest = set_pinned(_store(args), args.job, args.id, args.command == "pin")
    _emit(args, manifest.summary(), lambda: out.print(f"snapshot {manifest.id} {args.command}ned"))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    store = _store(args)
    plan = plan_restore(store, args.job, args.id, open_storage(args.to), allow_sink_ahead=args.allow_sink_ahead)
    result = (
        plan.describe()
        if args.dry_run
        else execute_restore(store, plan, progress=BarProgress(), concurrency=args.concurrency)
    )
    result["dry_run"] = args.dry_run

    def human() -> None:
        verb = "would restore" if args.dry_run else "restored"
        out.print(
            f"{verb} snapshot {plan.manifest.id} (batch {plan.manifest.batch_id}) into {plan.target.uri}: "
            f"{len(plan.files)} files, {_human_bytes(plan.total_bytes)}; the query resumes at batch "
            f"{result['resumes_at_batch']}"
        )
        for path in plan.rewrites:
            out.print(f"  rewrote absolute paths in {path}")
        for warning in plan.warnings:
            err.print(f"[yellow]warning:[/] {warning}")
        if plan.spark_conf:
            out.print("start the restored query with these Spark confs:")
            for key, value in sorted(plan.spark_conf.items()):
                out.print(f"  --conf {key}={value}")

    _emit(args, result, human)
    return 0


def _job_store(args: argparse.Namespace, job: JobSpec) -> SnapshotStore:
    return SnapshotStore(open_storage(args.store or os.environ.get(STORE_ENV) or job.store))


def cmd_deploy(args: argparse.Namespace) -> int:
    job = get_job(args.job, args.jobs)
    request = DeployRequest(
        job=job,
        version=args.version,
        restore=args.restore,
        wait_seconds=args.wait,
        requested_by=os.environ.get("USER", ""),
    )
    builder = default_command
    if args.spark_conn:  # the Spark provider's hook builds the command from an Airflow connection
        from .hooks.spark_submit import hook_command_builder

        builder = hook_command_builder(args.spark_conn)
    deployment = deploy(request, _job_store(args, job), command_builder=builder, progress=BarProgress())
    data = {
        "job": job.name,
        "deployment": deployment.id,
        "version": deployment.version,
        "checkpoint": deployment.checkpoint,
        "restored_from": deployment.restored_from,
        "restored_batch_id": deployment.restored_batch_id,
        "log": deployment.launcher.get("log"),
    }
    _emit(args, data, lambda: out.print(deployment.id))
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    job = get_job(args.job, args.jobs)
    report = preflight(job, _job_store(args, job), args.snapshot, args.version, allow_renames=args.allow_renames)

    def human() -> None:
        verdict = "[green]PASSED[/]" if report.passed else "[red]BLOCKED[/]"
        out.print(
            f"pre-flight of {job.name} {report.version} on {report.snapshot} (batch {report.batch_id}): {verdict}"
        )
        out.print(report.reason)

    _emit(args, report.to_dict(), human)
    report.raise_if_blocked()  # exit code 4 (refused) when blocked
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    jobs = [get_job(args.job, args.jobs)] if args.job else list(load_jobs(args.jobs).values())
    rows = [row for job in jobs for row in job_status(job, _job_store(args, job))]

    def human() -> None:
        if not rows:
            out.print("no deployments")
            return
        table = Table(show_edge=False, header_style="bold")
        for column in ("job", "deployment", "version", "state", "heartbeat", "batch", "rows/s", "restored from"):
            table.add_column(column, no_wrap=True)
        for r in rows:
            age = "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.0f}s"
            rate = "-" if r["rows_per_second"] is None else f"{r['rows_per_second']:.0f}"
            table.add_row(
                r["job"],
                r["deployment"],
                r["version"],
                r["state"],
                age,
                "-" if r["last_batch_id"] is None else str(r["last_batch_id"]),
                rate,
                r["restored_from"] or "",
            )
        out.print(table)

    _emit(args, rows, human)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    job = get_job(args.job, args.jobs)
    result = stop(
        job,
        _job_store(args, job),
        savepoint=args.savepoint,
        drain=args.drain,
        timeout=args.timeout,
        requested_by=os.environ.get("USER", ""),
        progress=BarProgress(),
    )

    def human() -> None:
        if result.snapshot:
            out.print(result.snapshot.id)
        else:
            out.print(f"deployment {result.deployment.id} {result.state} after {result.seconds:.1f}s")

    _emit(args, result.to_dict(), human)
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    job = get_job(args.job, args.jobs)
    deployment = kill(job, _job_store(args, job))
    _emit(
        args,
        {"job": job.name, "deployment": deployment.id, "state": "FAILED"},
        lambda: out.print(f"killed deployment {deployment.id} of job {job.name}"),
    )
    return 0


def _policy_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The retention flags as a retention table (same keys and validation as jobs.toml)."""
    raw: dict[str, Any] = {}
    for kind in ("checkpoint", "savepoint"):
        limits = {
            key: value
            for key, value in (
                ("keep_last", getattr(args, f"{kind}_keep_last")),
                ("max_age", getattr(args, f"{kind}_max_age")),
            )
            if value is not None
        }
        if limits:
            raw[kind] = limits
    for key in ("failed_grace", "abandoned_after", "on_cancellation", "retired_retention", "blob_grace"):
        if getattr(args, key) is not None:
            raw[key] = getattr(args, key)
    return raw


def _retention(args: argparse.Namespace) -> tuple[RetentionPolicy, dict[str, RetentionPolicy], dict[str, JobSpec]]:
    """Defaults <- the job's `retention` in the jobs file (when there is one) <- flags (flags win)."""
    flags = _policy_flags(args)
    default = parse_policy(flags, "retention flags")
    try:
        jobs = load_jobs(args.jobs)
    except NotFound:
        if args.jobs or os.environ.get(JOBS_ENV):
            raise
        jobs = {}
    per_job = {
        name: parse_policy(
            flags, "retention flags", parse_policy(spec.retention, f"{jobs_file(args.jobs)} [jobs.{name}] retention")
        )
        for name, spec in jobs.items()
    }
    return default, per_job, jobs


def _plan_table(plan: Plan) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for column in ("action", "job", "target", "reason"):
        table.add_column(column, no_wrap=column != "reason")
    for row in plan.rows():
        table.add_row(*row)
    return table


def cmd_prune(args: argparse.Namespace) -> int:
    policy, per_job, jobs = _retention(args)
    uri = args.store or os.environ.get(STORE_ENV) or (jobs[args.job].store if args.job in jobs else None)
    if not uri:
        raise InvalidInput(f"no snapshot store: pass --store URI, set {STORE_ENV}, or declare the job in the jobs file")
    timeout = jobs[args.job].heartbeat_timeout if args.job in jobs else 30.0
    plan, result = prune(
        SnapshotStore(open_storage(uri)),
        policy,
        job=args.job,
        job_policies=per_job,
        dry_run=args.dry_run,
        heartbeat_timeout=timeout,
    )
    data = {"dry_run": args.dry_run, "plan": plan.to_dict(), "result": result.to_dict() if result else None}

    def human() -> None:
        out.print(_plan_table(plan) if plan.rows() else "nothing to delete")
        for note in plan.notes:
            out.print(f"note: {note}")
        if result is None:
            out.print("dry run: nothing was deleted")
        else:
            out.print(
                f"deleted {result.snapshots} snapshots, {result.checkpoints} retired checkpoint locations "
                f"and {result.blobs} stored files ({result.deferred_blobs} left for the next run)"
            )

    _emit(args, data, human)
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    job: JobSpec | None = None
    try:
        job = get_job(args.job, args.jobs)
    except NotFound:
        if args.jobs or os.environ.get(JOBS_ENV) or jobs_file(args.jobs).exists():
            raise
    uri = args.store or os.environ.get(STORE_ENV) or (job.store if job else None)
    if not uri:
        raise InvalidInput(f"no snapshot store: pass --store URI, set {STORE_ENV}, or declare the job in the jobs file")
    outcomes = retain_checkpoints(
        SnapshotStore(open_storage(uri)),
        args.job,
        requested_by=os.environ.get("USER", ""),
        heartbeat_timeout=job.heartbeat_timeout if job else 30.0,
        concurrency=args.concurrency,
    )

    def human() -> None:
        if not outcomes:
            out.print(f"job {args.job} has no RUNNING deployment: nothing to checkpoint")
        for o in outcomes:
            if o.skipped:
                out.print(f"deployment {o.deployment}: skipped ({o.skipped})")
            else:
                out.print(f"deployment {o.deployment}: checkpoint [bold]{o.snapshot}[/] at batch {o.batch_id}")

    _emit(args, [o.to_dict() for o in outcomes], human)
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", help=f"snapshot store URI: s3://bucket/prefix or a path (default ${STORE_ENV})")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    common.add_argument("--concurrency", type=int, default=16, help="parallel transfers (default 16)")
    snapshot = argparse.ArgumentParser(add_help=False, parents=[common])
    snapshot.add_argument("--job", required=True, help="job name")
    snapshot.add_argument("id", help="snapshot id, or 'latest' for the newest COMPLETED one")

    parser = argparse.ArgumentParser(
        prog="savepoints",
        description="Consistent, incremental, verified savepoints of Spark Structured Streaming checkpoints.",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    create = commands.add_parser("create", parents=[common], help="snapshot a checkpoint (live or stopped)")
    create.add_argument("--job", required=True)
    create.add_argument("--checkpoint", required=True, help="checkpoint location: path, file://, s3:// or s3a://")
    create.add_argument("--kind", choices=[k.value for k in Kind], default=Kind.SAVEPOINT.value)
    create.add_argument("--trigger", choices=[t.value for t in Trigger], default=Trigger.MANUAL.value)
    create.add_argument("--label", action="append", default=[], metavar="K=V")
    create.add_argument("--pin", action="store_true", help="never delete by retention")
    create.add_argument(
        "--sink",
        action="append",
        default=[],
        metavar="LOCATION",
        help="output location of a file sink whose position to record (repeatable)",
    )
    create.add_argument("--requested-by", default="")
    create.set_defaults(func=cmd_create)

    listing = commands.add_parser("list", parents=[common], help="list snapshots")
    listing.add_argument("--job")
    listing.set_defaults(func=cmd_list)

    commands.add_parser("show", parents=[snapshot], help="show one snapshot's manifest").set_defaults(func=cmd_show)
    verify = commands.add_parser("verify", parents=[snapshot], help="check every stored file's checksum")
    verify.add_argument("--deep", action="store_true", help="also restore to scratch and read all state with Spark")
    verify.set_defaults(func=cmd_verify)
    delete = commands.add_parser("delete", parents=[snapshot], help="delete a snapshot")
    delete.add_argument("--force", action="store_true", help="delete even if pinned")
    delete.set_defaults(func=cmd_delete)
    commands.add_parser("pin", parents=[snapshot], help="protect from retention").set_defaults(func=cmd_pin)
    commands.add_parser("unpin", parents=[snapshot], help="remove the protection").set_defaults(func=cmd_pin)
    restore = commands.add_parser("restore", parents=[snapshot], help="restore into a new checkpoint location")
    restore.add_argument("--to", required=True, help="an empty or absent location")
    restore.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    restore.add_argument(
        "--allow-sink-ahead",
        action="store_true",
        help="restore even if a recorded file sink committed batches beyond the snapshot",
    )
    restore.set_defaults(func=cmd_restore)

    jobs = argparse.ArgumentParser(add_help=False, parents=[common])
    jobs.add_argument("--jobs", help=f"the jobs file (default ${JOBS_ENV}, else ./jobs.toml)")
    deploy_cmd = commands.add_parser("deploy", parents=[jobs], help="launch a job version as a new deployment")
    deploy_cmd.add_argument("job")
    deploy_cmd.add_argument("--version", help="a version declared in the jobs file (default: its default_version)")
    deploy_cmd.add_argument(
        "--restore",
        default="none",
        metavar="|".join([*RESTORE_MODES, "ID"]),
        help="where the state comes from (default none)",
    )
    deploy_cmd.add_argument(
        "--partitions", type=int, help="state partitions; differing from the snapshot's rescales its state first"
    )
    deploy_cmd.add_argument("--wait", type=float, default=180, help="seconds to wait for RUNNING (default 180)")
    deploy_cmd.add_argument(
        "--spark-conn", metavar="CONN_ID", help="build spark-submit from this Airflow connection (the [airflow] extra)"
    )
    deploy_cmd.set_defaults(func=cmd_deploy)
    preflight_cmd = commands.add_parser(
        "preflight", parents=[jobs], help="would this version run on that snapshot's state? (touches nothing live)"
    )
    preflight_cmd.add_argument("job")
    preflight_cmd.add_argument("--version", required=True, help="the new version, declared in the jobs file")
    preflight_cmd.add_argument("--snapshot", default="latest", help="snapshot id (default: latest)")
    preflight_cmd.add_argument(
        "--allow-renames", action="store_true", help="accept state field renames (Spark does not check names)"
    )
    preflight_cmd.set_defaults(func=cmd_preflight)
    status_cmd = commands.add_parser("status", parents=[jobs], help="deployments with state and heartbeat")
    status_cmd.add_argument("job", nargs="?")
    status_cmd.set_defaults(func=cmd_status)
    stop_cmd = commands.add_parser("stop", parents=[jobs], help="stop the running deployment at a batch boundary")
    stop_cmd.add_argument("job")
    stop_cmd.add_argument("--savepoint", action="store_true", help="then snapshot the quiescent checkpoint")
    stop_cmd.add_argument("--drain", action="store_true", help="process what is available first")
    stop_cmd.add_argument("--timeout", type=float, help="seconds (default: trigger interval + 60)")
    stop_cmd.set_defaults(func=cmd_stop)
    kill_cmd = commands.add_parser("kill", parents=[jobs], help="force-kill a deployment that will not stop")
    kill_cmd.add_argument("job")
    kill_cmd.set_defaults(func=cmd_kill)
    prune_cmd = commands.add_parser("prune", parents=[jobs], help="apply retention: delete old snapshots and leftovers")
    prune_cmd.add_argument("--job", help="only this job's snapshots and deployments (blobs are store-wide)")
    prune_cmd.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    for kind in ("checkpoint", "savepoint"):
        prune_cmd.add_argument(f"--{kind}-keep-last", type=int, metavar="N", help=f"keep the newest N {kind}s")
        prune_cmd.add_argument(f"--{kind}-max-age", metavar="AGE", help=f"delete {kind}s older than AGE (e.g. 2d)")
    prune_cmd.add_argument("--failed-grace", metavar="AGE", help="keep FAILED snapshots this long (default 1d)")
    prune_cmd.add_argument("--abandoned-after", metavar="AGE", help="IN_PROGRESS this old crashed (default 6h)")
    prune_cmd.add_argument(
        "--on-cancellation", choices=["retain", "delete"], help="retired deployments' live checkpoints"
    )
    prune_cmd.add_argument("--retired-retention", metavar="AGE", help="retain-on-cancellation period (default 7d)")
    prune_cmd.add_argument("--blob-grace", metavar="AGE", help="leave unreferenced contents this long (default 1h)")
    prune_cmd.set_defaults(func=cmd_prune)
    checkpoint_cmd = commands.add_parser(
        "checkpoint", parents=[jobs], help="retained checkpoints: snapshot every running deployment of a job"
    )
    checkpoint_cmd.add_argument("--job", required=True)
    checkpoint_cmd.set_defaults(func=cmd_checkpoint)
    return parser


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (not the stream of the first call: tests swap it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _configure_logging(level: int) -> None:
    root = logging.getLogger()
    if not any(isinstance(handler, _StderrHandler) for handler in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(logging.INFO if args.verbose else logging.WARNING)
    try:
        return args.func(args)
    except SavepointsError as exc:
        return _fail(args, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fail(args, "interrupted", 130)
    except Exception as exc:  # an unexpected failure still gets one clear line, not a traceback
        logging.getLogger(__name__).info("unexpected error", exc_info=True)
        return _fail(args, f"unexpected {type(exc).__name__}: {exc} (run with -v for details)", 1)


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"error": message, "exit_code": code}))
    err.print(Text.assemble(("error: ", "red"), message), soft_wrap=True)  # one line, however long
    return code


if __name__ == "__main__":
    sys.exit(main())
