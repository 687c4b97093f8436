"""Savepoints, restores, verification, an upgrade and retention at the scale users run, on a disk-backed S3 server,
side by side with `s5cmd` and `aws s3 sync` in the same run (`make bench-scale`).

    uv run python -m bench.scale_bench [--state-mb 5120] [--batch-mb 400] [--savepoints 50] [--partitions 200]

The server (`--server`, devtools/disk_s3.py) is SeaweedFS by default: like S3, it keeps the SHA-256 S3A sends with
each upload, by which a snapshot copies a checkpoint's files within the server. S3Proxy with its filesystem store
drops it (a snapshot then reads each file once to hash it), and is what `--smoke` runs on: it comes from Maven
Central in seconds, where SeaweedFS is built once in minutes (`make seaweedfs`). Its objects go under
.bench/scale-run/s3. The
job (bench/scale_job.py) deduplicates 1 KiB incompressible keys on RocksDB with changelog checkpointing at Spark's
default 200 partitions, its checkpoints on s3a:// of that server, run as a managed deployment by spark-submit. It
grows, a batch a file, to `--state-mb` of state. Then, in this order, each figure against its peer:

1. peers copy the live checkpoint within S3: `s5cmd cp` and `aws s3 sync` (S3 -> S3, CopyObject each file);
2. the first live savepoint (`savepoints savepoint`): time, requests and bytes through its process (every request
   of these four goes through a counting proxy, devtools/faulty_s3.py with no faults), peak memory;
3. about 1% new keys, one batch, and the second savepoint: its time and bytes against the first's;
4. a restore of the first savepoint into a new local directory against `s5cmd` downloading the same files from
   the peer's copy; `verify` and `verify --deep`;
5. an upgrade's pre-flight (v2: the same query) and a stop/restore upgrade to it while the input keeps coming:
   the time the job commits nothing (commits/ of the old and the new checkpoint, by S3's LastModified);
6. `--savepoints` more savepoints, a small batch before each, then `prune` keeping 10 with garbage collection;
7. the peak RSS of every `savepoints` process (wait4) and of the driver (its process group's VmHWM).

Every command is the `savepoints` command line in a process of its own. Targets (issue 52), printed as ratios:
first savepoint <= s5cmd cp; second <= 5% of the first's time and bytes; restore <= 1.2x s5cmd's download;
bytes through the engine <= 2% of what it copied within S3; the savepoints process's peak <= 512 MB. Writes
.bench/scale.json; exit code 0 even when a target is missed. `--smoke` runs every step on a few MB (the test
tests/e2e/test_scale_bench.py, so that the bench cannot rot).

Over 300 lines: one benchmark, its job, its peers and its report; split, each part would need the others' state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.stop import kill
from airflow_plugin.core.records.manifest import Manifest
from airflow_plugin.core.storage import open_storage
from bench.report import Results, Target, log, report
from bench.snapshot_bench import BENCH_DIR, mb, run_measured, run_tool_usage, venv_tool
from bench.upgrade_bench import _group_hwm
from devtools import jvm
from devtools.disk_s3 import SERVERS, DiskS3, SeaweedS3, disk_server, server_version
from devtools.faulty_s3 import FaultyS3
from devtools.feeding import BackgroundFeeder
from devtools.windowed import processed, wait_for

JOB = "scale"
BUCKET = "bench-scale"
WORK = BENCH_DIR / "scale-run"
RESULTS = BENCH_DIR / "scale.json"
ROWS_PER_MB = 1000  # a 1 KiB key a row (bench/scale_job.py): about a thousand rows a MB of state
CHANGE = 0.01  # the share of new keys before the second savepoint
SMALL_ROWS = 2000  # the batches fed while an upgrade's health gate counts them, and between retention's savepoints
KEEP = 10  # retention keeps the newest savepoints
PHASES = ("deep", "upgrade", "retention")  # the steps --skip may leave out
# targets
FIRST_VS_S5CMD = 1.0
SECOND_VS_FIRST = 0.05
RESTORE_VS_S5CMD = 1.2
BYTES_THROUGH = 0.02
PEAK_MB = 512.0


@dataclass
class Command:
    """One `savepoints` run: its time, its own peak RSS, what it printed, and what the counting proxy saw."""

    seconds: float
    peak_mb: float
    output: Any
    counts: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0  # user and system CPU of the process itself (wait4), its waited-for children included

    @property
    def through(self) -> int:
        return self.counts.get("bytes_up", 0) + self.counts.get("bytes_down", 0)


class Bench:
    """The server, the proxy, the job and what the steps measured."""

    def __init__(self, server: DiskS3 | SeaweedS3, proxy: FaultyS3, args: argparse.Namespace) -> None:
        self.server, self.proxy, self.args = server, proxy, args
        self.direct = server.env()
        self.counted = {**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
        self.work: Path = args.work
        self.jobs_file = write_jobs_file(self.work, args.partitions)
        self.job: JobContext = Settings(jobs_file=str(self.jobs_file)).resolve().job(JOB)
        self.feeder = Feeder(self.work / "input", args.partitions, caught_up=self.caught_up)
        self.results = Results()
        self.profiles = 0

    # --- the command line, in a process of its own

    def savepoints(self, *args: str, counted: bool = False) -> Command:
        env = {**installed_env(), **(self.counted if counted else self.direct)}
        command = [venv_tool("savepoints"), "--jobs", str(self.jobs_file), "--json", *args]
        profile = None
        if self.args.profile:  # where the time goes: the command under cProfile, its top printed after it
            self.profiles += 1
            profile = self.work / "profiles" / f"{self.profiles:02d}-{args[0]}.prof"
            profile.parent.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "cProfile", "-o", str(profile), *command]
        if counted:
            self.proxy.reset_counts()
        try:
            process = run_measured(command, env, f"savepoints {' '.join(args)}", cwd=self.work)
        finally:
            counts = self.proxy.reset_counts() if counted else {}
        try:
            output = json.loads(process.stdout)
        except ValueError:
            output = process.stdout
        ran = Command(process.seconds, process.peak_mb, output, counts=counts, cpu_s=process.cpu_s)
        log(
            f"savepoints {' '.join(args[:2])}: {ran.seconds:.2f} s, CPU {ran.cpu_s:.2f} s, peak {ran.peak_mb:.0f} MB, "
            f"{counts or ''}"
        )
        if profile is not None:
            print_profile(profile)
        return ran

    def manifest(self, snapshot_id: str) -> Manifest:
        return self.job.store.get(JOB, snapshot_id)

    def savepoint(self, counted: bool = False) -> tuple[Command, Manifest]:
        before = {entry.id for entry in self.job.store.list(JOB)}
        run = self.savepoints("savepoint", JOB, counted=counted)
        [new] = [entry.id for entry in self.job.store.list(JOB) if entry.id not in before]
        manifest = self.manifest(new)
        log(
            f"  {new}: batch {manifest.batch_id}, {len(manifest.files):,} files, {mb(manifest.total_bytes)} MB, "
            f"{mb(manifest.uploaded_bytes)} MB new, timings {manifest.timings}"
        )
        return run, manifest

    # --- the job

    @property
    def checkpoint(self) -> str:
        return self.job.deployments.list(JOB)[-1].checkpoint

    def driver_peak_mb(self) -> float:
        deployment = self.job.deployments.list(JOB)[-1]
        pid = deployment.launcher.get("pid")
        try:
            return _group_hwm(os.getpgid(int(pid))) / 1024 if pid else 0.0
        except ProcessLookupError:
            return 0.0

    def caught_up(self, pending: int = 2) -> bool:
        """Whether the live deployment has read all but the newest `pending` files fed (False while none can tell:
        a new version's checkpoint not restored yet)."""
        try:
            return processed(self.checkpoint, self.feeder.files - pending)
        except Exception:  # the store or the checkpoint mid-change: feed at the next round
            return False

    def fed(self) -> None:
        """Until the running deployment has committed a batch of every file fed."""
        wait_for(
            lambda: processed(self.checkpoint, self.feeder.files), f"batch of input file {self.feeder.files}", 3600
        )

    def grow(self) -> float:
        rows = self.args.state_mb * ROWS_PER_MB
        per_batch = max(1, self.args.batch_mb * ROWS_PER_MB)
        started = time.monotonic()
        while self.feeder.rows < rows:
            self.feeder.feed(min(per_batch, rows - self.feeder.rows))
            self.fed()
            log(f"grown to {self.feeder.rows:,} keys of {rows:,} ({time.monotonic() - started:.0f} s)")
        return time.monotonic() - started


class Feeder:
    """Input files of chunks (bench/scale_job.py): `feed` writes one file, one batch, of new keys. `caught_up`: whether
    the job has read all but the newest few files, so that a round in the background feeds at the job's own pace
    (a file every 5 s through a 15-minute upgrade at 5 GB left 160 batches for the new version to catch up on)."""

    def __init__(self, input_dir: Path, partitions: int, caught_up: Callable[[], bool] | None = None) -> None:
        self.input_dir = input_dir
        self.files = self.rows = 0
        self.chunks = max(2, min(8, partitions))
        self.caught_up = caught_up
        input_dir.mkdir(parents=True, exist_ok=True)

    def feed(self, rows: int) -> None:
        step = -(-rows // self.chunks)
        lines = [f"{self.files},{first},{min(step, rows - first)}\n" for first in range(0, rows, step)]
        path = self.input_dir / f"batch-{self.files:05d}.csv"
        tmp = self.input_dir / f".{path.name}.tmp"  # the file source must never see half a file
        tmp.write_text("".join(lines))
        tmp.replace(path)
        self.files += 1
        self.rows += rows

    def round(self) -> None:  # BackgroundFeeder's
        if self.caught_up is None or self.caught_up():
            self.feed(SMALL_ROWS)


def installed_env() -> dict[str, str]:
    """This environment, as an installed command line runs in it: from bytecode. With PYTHONDONTWRITEBYTECODE set
    (some CI shells and sandboxes set it) every `savepoints` command compiled boto3's and its own sources again,
    0.5 to 1 s a command on a loaded machine, which pip's install (it compiles) or the first run (Python caches
    it) saves a user."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def warm_bytecode() -> None:
    """Compile the command line's modules once, before anything is timed (what the first run of an install does)."""
    modules = "import boto3, s3transfer.manager, airflow_plugin.cli.main, airflow_plugin.core.snapshots.restore"
    subprocess.run([venv_tool("python"), "-c", modules], env=installed_env(), check=True)


def write_jobs_file(directory: Path, partitions: int) -> Path:
    """The job on the disk-backed server: its store on s3://, its checkpoints on s3a://, v1 and v2 the same query."""
    conf = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.jars": str(jvm.link("s3a") / "*.jar"),
        "spark.ui.enabled": "false",
        "spark.driver.memory": "3g",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # RocksDB's memtables, block cache and index of all 200 stores bounded together, as a job with gigabytes of
        # state runs it: unbounded, each store's memtables hold their share until a snapshot, in the driver's RSS
        "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
        "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": "1024",
        # each batch's shuffle files (as large as its input) go once a GC finds them unreferenced: every 30 minutes
        # by default, so that 5 GB of keys left 14 GB of them on the disk
        "spark.cleaner.periodicGC.interval": "1min",
    }
    script = Path(__file__).resolve().parent / "scale_job.py"
    path = directory / "jobs.toml"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""
[jobs.{JOB}]
store = "s3://{BUCKET}/store"
checkpoint_root = "s3a://{BUCKET}/checkpoints"
log_dir = "logs"
trigger_interval = "1 second"
heartbeat_timeout = 120
preflight_timeout = 3600
args = ["--input", "{directory / "input"}"]
conf = {{ {", ".join(f'"{key}" = "{value}"' for key, value in conf.items())} }}
versions.v1 = {{ script = "{script}" }}
versions.v2 = {{ script = "{script}", args = ["--tag", "v2"] }}
retention.savepoint = {{ keep_last = {KEEP} }}
"""
    )
    return path


def commit_times(checkpoint: str, after_batch: int = -1) -> list[tuple[int, float]]:
    """(batch, S3's LastModified) of each commit of a checkpoint after `after_batch`."""
    storage = open_storage(checkpoint)
    found = [(info.key.removeprefix("commits/"), info.mtime) for info in storage.list("commits/")]
    return sorted((int(name), mtime) for name, mtime in found if name.isdigit() and int(name) > after_batch)


def s5cmd(bench: Bench, *args: str, counted: bool = True) -> tuple[float, float, dict[str, int]]:
    """s5cmd's time, its CPU seconds and what the counting proxy saw of it."""
    endpoint = bench.proxy.endpoint if counted else bench.server.endpoint
    command = [venv_tool("s5cmd"), "--endpoint-url", endpoint, *args]
    bench.proxy.reset_counts()
    seconds, cpu = run_tool_usage(command, bench.direct, "s5cmd")
    return seconds, cpu, bench.proxy.reset_counts()


def peers_copy(bench: Bench) -> dict[str, Any]:
    """s5cmd and aws s3 sync copy the live checkpoint within S3 (CopyObject), both through the counting proxy."""
    source = bench.checkpoint.replace("s3a://", "s3://")
    seconds, cpu, counts = s5cmd(bench, "cp", f"{source}/*", f"s3://{BUCKET}/peer-s5cmd/")
    files = list(open_storage(f"s3://{BUCKET}/peer-s5cmd").list())
    drop(bench, f"s3://{BUCKET}/peer-s5cmd")  # gigabytes of the machine's disk, before the next copy
    sync = [venv_tool("aws"), "--endpoint-url", bench.proxy.endpoint, "s3", "sync", f"{source}/"]
    sync += [f"s3://{BUCKET}/peer-aws/", "--only-show-errors", "--no-progress"]
    bench.proxy.reset_counts()
    aws_s, aws_cpu = run_tool_usage(sync, bench.direct, "aws s3 sync")
    aws_counts = bench.proxy.reset_counts()
    drop(bench, f"s3://{BUCKET}/peer-aws")
    return {
        "s5cmd_s": seconds,
        "s5cmd_cpu_s": cpu,
        "s5cmd_requests": counts["requests"],
        "aws_s": aws_s,
        "aws_cpu_s": aws_cpu,
        "aws_requests": aws_counts["requests"],
        "files": len(files),
        "bytes": sum(info.size for info in files),
    }


def restore_against_s5cmd(bench: Bench, manifest: Manifest) -> dict[str, Any]:
    """The engine's restore of `manifest` into a new local directory, and s5cmd downloading the same files from the
    checkpoint (those still there: maintenance may have deleted a few since), both direct."""
    target, peer_dir = bench.work / "restored", bench.work / "s5cmd-download"
    for stale in (target, peer_dir):
        shutil.rmtree(stale, ignore_errors=True)
    restored = bench.savepoints("restore", JOB, manifest.id, "--to", str(target))
    source = manifest.source.replace("s3a://", "s3://")
    there = {info.key: info.size for info in open_storage(source).list()}
    paths = [entry.path for entry in manifest.files if entry.path in there]
    commands = bench.work / "s5cmd-download.txt"
    commands.write_text("".join(f"cp {source}/{path} {peer_dir / path}\n" for path in paths))
    seconds, cpu, _ = s5cmd(bench, "run", str(commands), counted=False)
    for done in (target, peer_dir):
        shutil.rmtree(done, ignore_errors=True)
    return {
        "restore": restored,
        "s5cmd_s": seconds,
        "s5cmd_cpu_s": cpu,
        "s5cmd_files": len(paths),
        "s5cmd_bytes": sum(there[path] for path in paths),
        "files": len(manifest.files),
        "bytes": manifest.total_bytes,
    }


def drop(bench: Bench, uri: str) -> None:
    """Delete a peer's copy once measured, and give its disk back: at 5 GB of state, each copy is 8 GB."""
    storage = open_storage(uri)
    storage.delete([info.key for info in storage.list()])
    started = time.monotonic()
    bench.server.reclaim()
    log(f"  {uri} dropped; the server's disk reclaimed in {time.monotonic() - started:.1f} s")


def upgrade(bench: Bench) -> dict[str, Any]:
    """The pre-flight, then the stop/restore upgrade while small batches keep coming (its health gate counts the
    new version's batches): the time no batch commits, from the two checkpoints' commits."""
    preflight = bench.savepoints("preflight", JOB, "--version", "v2")
    old = bench.job.deployments.list(JOB)[-1]
    before = commit_times(old.checkpoint)
    with BackgroundFeeder(bench.feeder, interval=5.0):
        upgraded = bench.savepoints("upgrade", JOB, "--version", "v2", "--mode", "stop_restore")
        new = bench.job.deployments.list(JOB)[-1]
        last_old = commit_times(old.checkpoint)[-1]
        wait_for(lambda: bool(commit_times(new.checkpoint, last_old[0])), "the new version's first commit", 600)
    first_new = commit_times(new.checkpoint, last_old[0])[0]
    log(f"  no commit from batch {last_old[0]} to {first_new[0]}: {first_new[1] - last_old[1]:.2f} s")
    rhythm = statistics.median(b - a for (_, a), (_, b) in pairwise(before[-6:])) if len(before) > 2 else 0.0
    return {
        "preflight": preflight,
        "upgrade": upgraded,
        "downtime_s": first_new[1] - last_old[1],
        "rhythm_s": rhythm,
        "driver_peak_mb": bench.driver_peak_mb(),
    }


def retention(bench: Bench, count: int) -> dict[str, Any]:
    """`count` savepoints, a small batch before each; then prune keeping KEEP, contents collected at once."""
    seconds = []
    for number in range(count):
        bench.feeder.feed(SMALL_ROWS)
        bench.fed()
        run, _ = bench.savepoint()
        seconds.append(run.seconds)
        if (number + 1) % 10 == 0:
            log(f"retention: {number + 1} of {count} savepoints")
    pruned = bench.savepoints("prune", JOB, "--savepoint-keep-last", str(KEEP), "--blob-grace", "0s", counted=True)
    return {"savepoint_s": seconds, "prune": pruned}


def deep_verify_verdict(output: Any) -> str:
    """What `verify --deep` found: each store's rows, and whether they were compared with the original checkpoint
    (Spark reads it only while it still holds the snapshot's batch)."""
    report = output if isinstance(output, dict) else {}
    stores = [
        f"operator {op.get('operator')} {op.get('store')}: {op.get('rows')} rows, "
        + {True: "equal to the original's", False: "NOT equal to the original's", None: "not compared"}.get(
            op.get("matches_original"), "not compared"
        )
        for op in (report.get("deep") or {}).get("operators", [])
    ]
    return f"ok {report.get('ok')}; " + "; ".join(stores)


def state_bytes(manifest: Manifest) -> int:
    return sum(int(operator.get("bytes") or 0) for operator in manifest.state or [])


def run(args: argparse.Namespace) -> Results:
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    with disk_server(args.server, args.work / "s3") as server, FaultyS3(server.endpoint) as proxy:
        os.environ.update(server.env())  # this process's engine (deploy, the store's reads), direct
        server.create_bucket(BUCKET)
        warm_bytecode()
        bench = Bench(server, proxy, args)
        log(f"{server_version(args.server)} at {server.endpoint}; deploying {JOB} v1 ({args.partitions} partitions)")
        deploy(bench.job, DeployRequest("v1", wait_seconds=900))
        try:
            return measure(bench, args)
        finally:
            try:
                kill(bench.job)
            except Exception as exc:  # nothing running, or already gone: the bench's own result stands
                log(f"kill after the bench: {exc}")


def measure(bench: Bench, args: argparse.Namespace) -> Results:
    grow_s = bench.grow()
    driver_grown = bench.driver_peak_mb()
    log("peers: s5cmd cp and aws s3 sync of the live checkpoint within S3")
    peers = peers_copy(bench)
    log(f"  peers: {peers}")
    log("the first live savepoint")
    first, first_manifest = bench.savepoint(counted=True)
    log(f"{CHANGE:.0%} new keys, then the second savepoint")
    bench.feeder.feed(max(1, int(bench.feeder.rows * CHANGE)))
    bench.fed()
    second, second_manifest = bench.savepoint(counted=True)
    log("restore against s5cmd's download; verify; verify --deep")
    restore = restore_against_s5cmd(bench, first_manifest)
    log(f"  s5cmd's download: {restore['s5cmd_s']:.2f} s, {restore['s5cmd_files']} files")
    verify = bench.savepoints("verify", JOB, first_manifest.id)
    deep = None if "deep" in args.skip else bench.savepoints("verify", JOB, first_manifest.id, "--deep")
    upgraded = None
    if "upgrade" not in args.skip:
        log("pre-flight and a stop/restore upgrade")
        upgraded = upgrade(bench)
    kept = None
    if "retention" not in args.skip:
        log(f"retention: {args.savepoints} savepoints, then prune with garbage collection")
        kept = retention(bench, args.savepoints)
    return tabulate(
        bench,
        {
            "grow_s": grow_s,
            "driver_grown_mb": driver_grown,
            "peers": peers,
            "first": (first, first_manifest),
            "second": (second, second_manifest),
            "restore": restore,
            "verify": verify,
            "deep": deep,
            "upgrade": upgraded,
            "retention": kept,
        },
    )


def tabulate(bench: Bench, m: dict[str, Any]) -> Results:
    results = bench.results
    first, first_manifest = m["first"]
    second, second_manifest = m["second"]
    peers, restore, upgraded, kept = m["peers"], m["restore"], m["upgrade"], m["retention"]
    state = state_bytes(first_manifest)
    section = "job"
    results.row(section, "server", f"{server_version(bench.args.server)} on local disk, 127.0.0.1")
    results.row(
        section,
        "state",
        f"{mb(state)} MB of RocksDB state in the first savepoint ({bench.args.partitions} partitions, "
        f"{bench.feeder.rows:,} keys of 1 KiB fed; grown in {m['grow_s']:.0f} s)",
    )
    results.row(section, "live checkpoint", f"{peers['files']:,} files, {mb(peers['bytes'])} MB")
    results.row(section, "driver peak RSS (JVM and Python)", f"{m['driver_grown_mb']:,.0f} MB once grown")

    def savepoint_row(name: str, run: Command, manifest: Manifest) -> None:
        timings = manifest.timings or {}
        results.row(
            "savepoint",
            name,
            f"{run.seconds:.2f} s (plan {timings.get('plan_s')} s, copy {timings.get('copy_s')} s), "
            f"{run.counts.get('requests', 0):,} requests, {len(manifest.files):,} files of "
            f"{mb(manifest.total_bytes)} MB, {mb(manifest.uploaded_bytes)} MB stored anew, "
            f"{mb(run.through)} MB through the process, "
            f"CPU {run.cpu_s:.2f} s, peak {run.peak_mb:.0f} MB",
        )

    savepoint_row("first (live)", first, first_manifest)
    savepoint_row(f"second, after {CHANGE:.0%} new keys", second, second_manifest)
    results.row(
        "peers",
        "s5cmd cp within S3",
        f"{peers['s5cmd_s']:.2f} s, {peers['s5cmd_requests']:,} requests (the whole checkpoint), "
        f"CPU {peers['s5cmd_cpu_s']:.2f} s",
    )
    results.row(
        "peers",
        "aws s3 sync within S3",
        f"{peers['aws_s']:.2f} s, {peers['aws_requests']:,} requests, CPU {peers['aws_cpu_s']:.2f} s",
    )
    restored: Command = restore["restore"]
    results.row(
        "restore",
        "engine into a new local directory",
        f"{restored.seconds:.2f} s ({restore['files']:,} files, {mb(restore['bytes'])} MB), "
        f"CPU {restored.cpu_s:.2f} s, peak {restored.peak_mb:.0f} MB",
    )
    results.row(
        "restore",
        "s5cmd download of the same files",
        f"{restore['s5cmd_s']:.2f} s ({restore['s5cmd_files']:,} files, {mb(restore['s5cmd_bytes'])} MB), "
        f"CPU {restore['s5cmd_cpu_s']:.2f} s",
    )
    results.row("verify", "verify", f"{m['verify'].seconds:.2f} s, peak {m['verify'].peak_mb:.0f} MB")
    if m["deep"] is not None:  # its peak is its Spark application's: wait4 counts the descendants it waited for
        deep = m["deep"]
        results.row(
            "verify",
            "verify --deep",
            f"{deep.seconds:.2f} s, peak {deep.peak_mb:.0f} MB with its Spark; {deep_verify_verdict(deep.output)}",
        )
    if upgraded is not None:
        preflight = upgraded["preflight"]
        said = preflight.output if isinstance(preflight.output, dict) else {}
        results.row(
            "upgrade",
            "pre-flight",
            f"{preflight.seconds:.2f} s, peak {preflight.peak_mb:.0f} MB (its Spark application not counted); "
            f"snapshot {said.get('snapshot')} (batch {said.get('batch_id')}): {said.get('reason')}",
        )
        results.row(
            "upgrade",
            "stop/restore",
            f"{upgraded['upgrade'].seconds:.2f} s in all; no commit for {upgraded['downtime_s']:.2f} s "
            f"(the job's own rhythm before it: {upgraded['rhythm_s']:.2f} s); v2's driver peak "
            f"{upgraded['driver_peak_mb']:,.0f} MB",
        )
    peaks = [first, second, restored, m["verify"]]  # the commands that start no Spark
    if kept is not None:
        pruned: Command = kept["prune"]
        output = pruned.output if isinstance(pruned.output, dict) else {}
        what = {key: len(value) if isinstance(value, list | dict) else value for key, value in output.items()}
        results.row(
            "retention",
            f"{len(kept['savepoint_s'])} savepoints",
            f"median {statistics.median(kept['savepoint_s']) if kept['savepoint_s'] else 0:.2f} s each",
        )
        results.row(
            "retention",
            f"prune keeping {KEEP}, garbage collected",
            f"{pruned.seconds:.2f} s, {pruned.counts.get('requests', 0):,} requests, peak {pruned.peak_mb:.0f} MB; "
            + json.dumps(what)[:400],
        )
        peaks.append(pruned)
    peak = max(run.peak_mb for run in peaks)
    results.targets += [
        Target("first savepoint / s5cmd cp", first.seconds / peers["s5cmd_s"], FIRST_VS_S5CMD, "x"),
        Target("second savepoint's time / first's", second.seconds / first.seconds, SECOND_VS_FIRST, "x"),
        Target(
            "second savepoint's bytes / first's",
            second_manifest.uploaded_bytes / max(1, first_manifest.uploaded_bytes),
            SECOND_VS_FIRST,
            "x",
        ),
        Target("restore / s5cmd download", restored.seconds / restore["s5cmd_s"], RESTORE_VS_S5CMD, "x"),
        Target(
            "bytes through the engine / copied", first.through / max(1, first_manifest.total_bytes), BYTES_THROUGH, ""
        ),
        Target("savepoints process peak RSS", peak, PEAK_MB, "MB", f"at {mb(state)} MB of state"),
    ]
    results.data = {
        "server": server_version(bench.args.server),
        "state_bytes": state,
        "keys": bench.feeder.rows,
        "partitions": bench.args.partitions,
        "grow_s": round(m["grow_s"], 1),
        "peers": peers,
        "first": {
            "seconds": first.seconds,
            "cpu_s": first.cpu_s,
            "counts": first.counts,
            "timings": first_manifest.timings,
        },
        "second": {
            "seconds": second.seconds,
            "cpu_s": second.cpu_s,
            "counts": second.counts,
            "timings": second_manifest.timings,
        },
        "restore_s": restored.seconds,
        "restore_cpu_s": restored.cpu_s,
        "s5cmd_download_cpu_s": restore["s5cmd_cpu_s"],
        "s5cmd_download_s": restore["s5cmd_s"],
        "verify_s": m["verify"].seconds,
        "deep_verify_s": m["deep"].seconds if m["deep"] else None,
        "preflight_s": upgraded["preflight"].seconds if upgraded else None,
        "upgrade_s": upgraded["upgrade"].seconds if upgraded else None,
        "downtime_s": upgraded["downtime_s"] if upgraded else None,
        "prune_s": kept["prune"].seconds if kept else None,
        "peaks_mb": {"savepoints": peak, "driver": m["driver_grown_mb"]},
    }
    return results


def print_profile(path: Path, lines: int = 25) -> None:
    """The functions a command spent the most time in, itself and below (cumulative), from its cProfile file."""
    import io
    import pstats

    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("cumulative").print_stats(lines)
    log(f"profile {path.name}:\n{out.getvalue()}")


def main(argv: list[str] | None = None) -> Results:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--state-mb", type=int, default=5120, help="grow the state to about this many MB")
    parser.add_argument("--batch-mb", type=int, default=400, help="about this many MB of new keys a batch")
    parser.add_argument("--savepoints", type=int, default=50, help="savepoints before the retention's prune")
    parser.add_argument("--partitions", type=int, default=200, help="state partitions (spark.sql.shuffle.partitions)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="4 MB, 2 partitions, 3 savepoints, and no step that starts a Spark application of its own (deep verify, "
        "pre-flight, upgrade: their own tests run them)",
    )
    parser.add_argument(
        "--skip", action="append", default=[], choices=PHASES, help="leave a step out (repeat for more)"
    )
    parser.add_argument("--server", choices=SERVERS, help="seaweedfs (default), s3proxy (default with --smoke)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run each savepoints command under cProfile (slower), its profile in WORK/profiles, its top printed",
    )
    parser.add_argument("--work", type=Path, default=WORK, help="the run's directory, the server's objects included")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON report goes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.state_mb, args.batch_mb, args.savepoints, args.partitions = 4, 2, 3, 2
        args.skip = sorted({*args.skip, "deep", "upgrade"})
    args.server = args.server or ("s3proxy" if args.smoke else "seaweedfs")
    args.work = args.work.resolve()  # the jobs file names the input by it, for a driver in another directory
    results = run(args)
    report(results, args.results)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
