"""History benchmark (issue 26): what everyday commands cost at 10, 100 and 1,000 snapshots of one job and
with 100 jobs in one store, and prune with garbage collection of 10,000 snapshots and 100,000 packs; all on
ONE moto S3 server in its own process that counts every request and every body byte (bench/s3_server.py),
in one run. Each time is compared with the same command's at 10 snapshots of the same run.

    uv run python -m bench.history_bench       (`make bench-history`; BENCH_STAGES="history fleet gc" picks)

1. history: a synthetic checkpoint with Spark's default 200 state partitions (HDFS-backed, 25 delta files
   each) is snapshotted once, a real create: its manifest lists 5,000 files (about 850 kB). The history is
   grown from it by copying that manifest under new ids an hour apart (every fourth a retained checkpoint),
   written as a store before catalogs held them, then migrated with `savepoints catalog rebuild` (timed).
   At 10, 100 and 1,000 snapshots, each as the command line in a process of its own, 3 times (median):
   `list`, `show latest`, `restore latest --dry-run`, the planning of `deploy --restore latest-savepoint`
   (bench/deploy_plan.py; the job's first lease, which also lists the job's deployments, measured once
   before), `prune --dry-run` (the newest 24 of each kind kept); and the page's snapshot table (ui/views.py),
   read, then refreshed with nothing changed.
2. fleet: 100 jobs of 5 such snapshots and 2 deployments each (one running); migrated, then `savepoints
   status` (child process) and the page's job list (ui/views.py `fleet`, in this process: first, then warm).
3. gc: 10 jobs x 1,000 snapshots whose manifests reference 10 packs each of their own (100,000 packs),
   migrated, then `savepoints prune` keeping the newest 100 of each job: 9,000 snapshots and 90,000 packs
   deleted, in a child process whose peak memory is read with wait4.

Prints a table with PASS/MISS per target and writes the same as JSON to .bench/history_results.json. Exit
code 0 even when a target is missed; non-zero only when the benchmark could not run.

Over 300 lines: one benchmark, its three stages and its report.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_plugin.cli.main import main as cli_main
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.layout import manifest_key, pack_key
from airflow_plugin.core.parallel import run_parallel
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import FileEntry, Kind, Manifest, SnapshotStatus, Trigger, new_snapshot_id
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage
from bench.deploy_plan import plan as plan_deploy
from bench.report import Results, Target, log, report
from bench.snapshot_bench import S3Server, Usage, run_measured, s3_server
from devtools.forked import call
from tests.support.synthetic import write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".bench" / "history"
RESULTS = ROOT / ".bench" / "history_results.json"
BUCKET = "history"
JOB = "history"
LEVELS = (10, 100, 1000)
PARTITIONS, BATCHES = 200, 24  # 200 x 25 delta files: a 5,000-file manifest
RUNS = 3
FLEET_JOBS, FLEET_SNAPSHOTS = 100, 5
GC_JOBS, GC_SNAPSHOTS, GC_PACKS_EACH, GC_KEEP = 10, 1000, 10, 100
MB = 1_000_000

# targets (issue 26)
LATEST_VS_10, LATEST_REQUESTS, LATEST_BYTES = 1.5, 5, 2 * MB
LIST_SECONDS, LIST_BYTES = 2.0, 5 * MB
REFRESH_REQUESTS = 3
PRUNE_DRY_SECONDS = 3.0
GC_PEAK_MB = 500.0
FLEET_SECONDS = 2.0


@dataclass
class Measured:
    """A command's median time over its runs, and the most requests and bytes any run cost."""

    seconds: float
    usage: Usage
    runs: list[float]

    @property
    def requests(self) -> int:
        return self.usage.calls.total()

    def text(self) -> str:
        calls = ", ".join(f"{name} {count}" for name, count in self.usage.calls.most_common())
        return (
            f"{self.seconds:.2f} s (runs {', '.join(f'{r:.2f}' for r in self.runs)}), {self.requests} requests "
            f"({calls}), {self.usage.bytes_down / MB:.2f} MB read, {self.usage.bytes_up / MB:.2f} MB written"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "runs": [round(r, 3) for r in self.runs], **self.usage.as_dict()}


def measure(server: S3Server, step: Callable[[], object], runs: int = RUNS) -> Measured:
    times, usages = [], []
    for _ in range(runs):
        with server.phase() as usage:
            started = time.monotonic()
            step()
            times.append(time.monotonic() - started)
        usages.append(usage)
    most = max(usages, key=lambda u: (u.calls.total(), u.bytes_down))
    return Measured(statistics.median(times), most, times)


def forked(server: S3Server, target: Callable[..., object], *args: object) -> Callable[[], object]:
    """A step that runs `target(*args)` in a process of its own, forked from a server that imported the engine
    once (devtools/forked.py): its time is the command's own, not the interpreter's start."""

    def run() -> None:
        process = call(target, *args, env=server.env, out=str(WORK / "out.txt"))  # a list of 1,000: a megabyte
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"{getattr(target, '__name__', target)}{args} failed (exit {process.exitcode})")

    return run


def command(server: S3Server, *args: str) -> Callable[[], object]:
    """`savepoints ARGS`, in a process of its own."""
    return forked(server, cli_main, list(args))


def jobs_file(path: Path, store: str, names: list[str]) -> Path:
    body = f'[defaults]\nstore = "{store}"\ncheckpoint_root = "{WORK}/checkpoints"\n'
    body += "".join(f'\n[jobs.{name}]\nversions.v1 = {{ application = "job.py" }}\n' for name in names)
    path.write_text(body)
    return path


def copies(base: Manifest, job: str, count: int, newest: datetime) -> list[Manifest]:
    """`count` copies of `base` under new ids, an hour apart before `newest`, every fourth a checkpoint; what a
    listing shows differs as it would (batch, offsets, bytes stored anew, a label), the file list does not."""
    made = []
    for n in range(count):
        at = newest - timedelta(hours=n + 1)
        kind = Kind.CHECKPOINT if n % 4 == 3 else Kind.SAVEPOINT
        stamp = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        made.append(
            replace(
                base,
                id=new_snapshot_id(kind, at),
                job=job,
                kind=kind,
                created_at=stamp,
                completed_at=stamp,
                batch_id=100_000 - n,
                source_offsets=[str((100_000 - n) * 10)],
                uploaded_bytes=base.uploaded_bytes // (n % 7 + 1),
                labels={"hour": str(n)},
            )
        )
    return made


def write_unmarked(store: SnapshotStore, manifests: list[Manifest]) -> None:
    """As savepoints wrote stores before catalogs: the manifests alone."""
    list(run_parallel(lambda m: store.storage.write(manifest_key(m.job, m.id), m.to_json()), manifests, concurrency=32))


def deployments(store: SnapshotStore, job: str, *, running: bool) -> None:
    records = Deployments(store.storage)
    old = Deployment(f"dp-{job}-a", job, "v1", f"{WORK}/checkpoints/{job}/a", retired_at="2026-11-20T10:00:00Z")
    records.write_status(job, old.id, DeploymentStatus(State.STOPPED, time.time() - 86400, last_batch_id=10))
    records.put(old)
    if running:
        live = Deployment(f"dp-{job}-b", job, "v1", f"{WORK}/checkpoints/{job}/b")
        records.put(live)  # a heartbeat an hour ahead: RUNNING however long the measurement takes
        records.write_status(job, live.id, DeploymentStatus(State.RUNNING, time.time() + 3600, last_batch_id=99))


# ---------------------------------------------------------------- 1. one job's history


def history(server: S3Server, results: Results) -> None:
    store_uri = f"s3://{BUCKET}/store"
    store = SnapshotStore(open_storage(store_uri))
    checkpoint = write_checkpoint(WORK / "checkpoint", batches=BATCHES, partitions=PARTITIONS)
    base = create_snapshot(store, open_storage(str(checkpoint)), SnapshotRequest(job=JOB, job_version="v1"))
    size = len(base.to_json())
    log(f"the 200-partition manifest: {len(base.files)} files, {size / 1000:.0f} kB")
    results.row("history", "manifest", f"{len(base.files)} files, {size / 1000:.0f} kB (a real create)")
    deployments(store, JOB, running=False)
    jobs = jobs_file(WORK / "history.toml", store_uri, [JOB])
    target = WORK / "restore-target"
    newest = datetime.fromisoformat(base.created_at.replace("Z", "+00:00"))
    planned = copies(base, JOB, LEVELS[-1] - 1, newest)
    written = 0
    measured: dict[int, dict[str, Measured]] = {}
    for level in LEVELS:
        write_unmarked(store, planned[written : level - 1])
        written = level - 1
        with server.phase() as usage:
            started = time.monotonic()
            command(server, "catalog", "rebuild", JOB, "--store", store_uri)()
            seconds = time.monotonic() - started
        results.row(f"{level} snapshots", "migration (catalog rebuild)", Measured(seconds, usage, [seconds]).text())
        store_args = ("--store", store_uri)
        prune_args = ("--savepoint-keep-last", "24", "--checkpoint-keep-last", "24")
        steps = {
            "list": command(server, "list", JOB, *store_args, "--json"),
            "show latest": command(server, "show", JOB, "latest", *store_args, "--json"),
            "restore latest --dry-run": command(
                server, "restore", JOB, "latest", *store_args, "--to", str(target), "--dry-run", "--json"
            ),
            "deploy --restore latest-savepoint (planning)": forked(server, plan_deploy, str(jobs), JOB),
            "prune --dry-run": command(server, "prune", JOB, "--jobs", str(jobs), "--dry-run", "--json", *prune_args),
        }
        if level == LEVELS[0]:  # the job's first lease: it also lists the deployments, once (core/lease.py)
            first = measure(server, steps["deploy --restore latest-savepoint (planning)"], runs=1)
            log(f"the job's first lease, deploy's planning: {first.text()}")
            results.row(f"{level} snapshots", "deploy's planning, the job's first lease (once)", first.text())
        measured[level] = {name: measure(server, step) for name, step in steps.items()}
        measured[level] |= _page(server, jobs)
        for name, m in measured[level].items():
            log(f"{level} snapshots, {name}: {m.text()}")
            results.row(f"{level} snapshots", name, m.text())
    results.data["history"] = {str(level): {k: v.as_dict() for k, v in m.items()} for level, m in measured.items()}
    _history_targets(measured, results)


def _page(server: S3Server, jobs: Path) -> dict[str, Measured]:
    """The page's snapshot table as its endpoint reads it (ui/views.py, in this process, as the API server
    runs it): the first read, then a refresh with nothing changed."""
    from airflow_plugin.ui.views import snapshots_page

    ctx = Settings(jobs_file=str(jobs)).resolve().job(JOB)
    first = measure(server, lambda: snapshots_page(ctx, str(jobs)), runs=1)
    again = measure(server, lambda: snapshots_page(ctx, str(jobs)))
    return {"page: snapshot table, first read": first, "page: refresh, nothing changed": again}


def _history_targets(measured: dict[int, dict[str, Measured]], results: Results) -> None:
    top, bottom = measured[LEVELS[-1]], measured[LEVELS[0]]
    for name in ("show latest", "restore latest --dry-run", "deploy --restore latest-savepoint (planning)"):
        ratio = top[name].seconds / bottom[name].seconds
        detail = f"{top[name].seconds:.2f} s vs {bottom[name].seconds:.2f} s"
        results.targets.append(Target(f"{name}: 1,000 vs 10", ratio, LATEST_VS_10, "x", detail))
        results.targets.append(Target(f"{name}: requests at 1,000", top[name].requests, LATEST_REQUESTS, ""))
        results.targets.append(
            Target(f"{name}: MB read at 1,000", top[name].usage.bytes_down / MB, LATEST_BYTES / MB, "MB")
        )
    results.targets.append(Target("list of 1,000: time", top["list"].seconds, LIST_SECONDS, "s"))
    results.targets.append(Target("list of 1,000: MB read", top["list"].usage.bytes_down / MB, LIST_BYTES / MB, "MB"))
    refresh = top["page: refresh, nothing changed"]
    results.targets.append(Target("page refresh at 1,000: requests", refresh.requests, REFRESH_REQUESTS, ""))
    results.targets.append(
        Target("prune --dry-run at 1,000: time", top["prune --dry-run"].seconds, PRUNE_DRY_SECONDS, "s")
    )


# ---------------------------------------------------------------- 2. a fleet


def fleet(server: S3Server, results: Results) -> None:
    store_uri = f"s3://{BUCKET}/fleet"
    store = SnapshotStore(open_storage(store_uri))
    base = SnapshotStore(open_storage(f"s3://{BUCKET}/store")).latest(JOB)
    names = [f"job-{n:03d}" for n in range(FLEET_JOBS)]
    newest = datetime.now(UTC)
    write_unmarked(store, [m for name in names for m in copies(base, name, FLEET_SNAPSHOTS, newest)])
    list(run_parallel(lambda name: deployments(store, name, running=True), names, concurrency=16))
    jobs = jobs_file(WORK / "fleet.toml", store_uri, names)
    migration = measure(server, command(server, "catalog", "rebuild", "--store", store_uri), runs=1)
    status = measure(server, command(server, "status", "--jobs", str(jobs), "--json"))
    from airflow_plugin.ui.views import fleet as fleet_view

    context = Settings(jobs_file=str(jobs)).resolve()
    first = measure(server, lambda: fleet_view(context, str(jobs)), runs=1)
    warm = measure(server, lambda: fleet_view(context, str(jobs)))
    rows = [
        ("migration of 100 jobs (catalog rebuild)", migration),
        ("savepoints status", status),
        ("page: job list, first read", first),
        ("page: job list, refreshed", warm),
    ]
    for name, m in rows:
        log(f"100 jobs, {name}: {m.text()}")
        results.row("100 jobs", name, m.text())
    results.data["fleet"] = {name: m.as_dict() for name, m in rows}
    results.targets.append(Target("100 jobs: savepoints status", status.seconds, FLEET_SECONDS, "s"))
    results.targets.append(Target("100 jobs: the page's job list (first read)", first.seconds, FLEET_SECONDS, "s"))
    results.targets.append(Target("100 jobs: the page's job list (refreshed)", warm.seconds, FLEET_SECONDS, "s"))


# ---------------------------------------------------------------- 3. gc at scale


def gc(server: S3Server, results: Results) -> None:
    store_uri = f"s3://{BUCKET}/gc"
    store = SnapshotStore(open_storage(store_uri))
    packs = [pack_key(f"{n:032x}") for n in range(GC_JOBS * GC_SNAPSHOTS * GC_PACKS_EACH)]
    log(f"gc: writing {len(packs)} packs")
    list(run_parallel(lambda key: store.storage.write(key, b"p" * 64), packs, concurrency=64))
    newest = datetime.now(UTC) - timedelta(days=1)  # older than any grace period
    manifests = []
    for job in range(GC_JOBS):
        for n in range(GC_SNAPSHOTS):
            at = newest - timedelta(minutes=n)
            first = (job * GC_SNAPSHOTS + n) * GC_PACKS_EACH
            files = [
                FileEntry(f"state/0/{p}/1.delta", 64, f"{first + p:064x}", 0.0, packs[first + p], 0)
                for p in range(GC_PACKS_EACH)
            ]
            stamp = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            manifests.append(
                Manifest(
                    new_snapshot_id(Kind.SAVEPOINT, at),
                    f"gc-{job}",
                    Kind.SAVEPOINT,
                    Trigger.PERIODIC,
                    SnapshotStatus.COMPLETED,
                    "/ckpt",
                    stamp,
                    completed_at=stamp,
                    batch_id=n,
                    files=files,
                    total_bytes=64 * GC_PACKS_EACH,
                )
            )
    log(f"gc: writing {len(manifests)} manifests")
    write_unmarked(store, manifests)
    migration = measure(server, command(server, "catalog", "rebuild", "--store", store_uri), runs=1)
    args = [sys.executable, "-m", "airflow_plugin", "prune", "--store", store_uri, "--json",
            "--savepoint-keep-last", str(GC_KEEP), "--blob-grace", "0"]  # fmt: skip
    with server.phase() as usage:  # the child gets this process's environment: the server's address
        ran = run_measured(args, dict(os.environ), "prune", ROOT)
    seconds, peak = ran.seconds, ran.peak_mb
    result = json.loads(ran.stdout)["result"]
    pruned = Measured(seconds, usage, [seconds])
    deleted = f"{result['deleted_snapshots']} snapshots and {result['deleted_blobs']} packs deleted"
    results.row("gc: 10,000 snapshots, 100,000 packs", "migration (catalog rebuild)", migration.text())
    results.row(
        "gc: 10,000 snapshots, 100,000 packs", "prune with gc", f"{pruned.text()}; {deleted}; peak RSS {peak:.0f} MB"
    )
    results.data["gc"] = {
        "migration": migration.as_dict(),
        "prune": {**pruned.as_dict(), "peak_rss_mb": peak, **result},
    }
    expected = GC_JOBS * (GC_SNAPSHOTS - GC_KEEP)
    if result["deleted_snapshots"] != expected or result["deleted_blobs"] != expected * GC_PACKS_EACH:
        raise RuntimeError(f"the prune deleted {deleted}, expected {expected} and {expected * GC_PACKS_EACH}")
    results.targets.append(Target("prune + gc of 10,000 snapshots, 100,000 packs: peak RSS", peak, GC_PEAK_MB, "MB",
                                  f"{seconds:.1f} s"))  # fmt: skip


def main() -> None:
    started = time.monotonic()
    results = Results()
    chosen = os.environ.get("BENCH_STAGES", "history fleet gc").split()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    try:
        with s3_server() as server:
            os.environ.update(server.env)  # this process's engine (the page's reads, the set-up) too
            server.create_bucket(BUCKET)
            if "history" in chosen or "fleet" in chosen:
                history(server, results)
            if "fleet" in chosen:
                fleet(server, results)
            if "gc" in chosen:
                gc(server, results)
    finally:
        results.data["wall_s"] = round(time.monotonic() - started, 1)
        results.row("run", "wall time", f"{results.data['wall_s']:.0f} s")
        report(results, RESULTS)


if __name__ == "__main__":
    main()
