"""Snapshot engine benchmark against the peers (awscli, s5cmd, cp), everything on ONE moto S3 server.

    uv run python -m bench.snapshot_bench          (`make bench`; BENCH_CASES="synthetic p200" for some)

First the time and peak memory of a snapshot of a synthetic 100,000-file checkpoint into a local store,
in a child process, against `cp -r` of the same checkpoint. Then, for each case (`CASES`: 8 partitions
and one stateful operator, 117 batches; Spark's default 200 partitions and two stateful operators, dedup
+ aggregation, 9 batches; both RocksDB with changelog checkpointing):
1. A real checkpoint, built once under .bench/ and reused; every run works on a fresh copy of it.
2. Peers: `aws s3 sync` and `s5cmd cp` of the whole checkpoint.
3. First snapshot into s3://bench/<case>-store-<i>: time vs. awscli, files/bytes needed vs. the whole.
4. 10 more batches, second snapshot: bytes uploaded vs. bytes new since the first, time vs. the first.
5. Restore of the second snapshot vs. `s5cmd run` downloading the same files from the peer copy.

Other work on the machine makes single timings noisy, so every timed step runs several times (engine and
peer interleaved) and the best time of each counts. The S3 requests of every step are counted by the
server (bench/s3_server.py). Prints a table with PASS/MISS per target and writes the same as JSON to
.bench/results.json. The exit code is 0 even when a target is missed; non-zero only when the benchmark
itself could not run.

Over 300 lines: one benchmark, its peers and its report; split, each part would need the others' state.
"""

from __future__ import annotations

import filecmp
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from airflow_plugin.core.records.manifest import Manifest
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import S3Storage, open_storage
from bench import spark_feed
from bench.report import Results, Target, log, report
from devtools.embedded_s3 import DUMMY_CREDENTIALS, EmbeddedS3

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / ".bench"
SYNTHETIC_CHECKPOINT = BENCH_DIR / "synthetic-checkpoint"  # 100,000 files: written once, then reused
WORK_DIR = BENCH_DIR / "run"  # recreated on every run
RESULTS = BENCH_DIR / "results.json"

BUCKET = "bench"
JOB = "bench"
MORE_BATCHES = 10
SYNTHETIC_FILES = 100_000
REPEATS = 3  # snapshots, restores and the s5cmd download: best of 3
PEER_UPLOAD_REPEATS = 2  # whole-checkpoint uploads take 10-20 s each: best of 2

# targets of every case and of the 100,000-file snapshot
SECOND_UPLOAD_VS_NEW = 1.2
PEAK_RSS_MB = 300.0
SYNTHETIC_VS_CP = 2.0


@dataclass(frozen=True)
class Case:
    """One checkpoint shape and its targets."""

    slug: str  # names its directories under .bench/ and its store prefixes
    partitions: int
    query: str  # spark_feed.QUERIES
    batches: int
    first_vs_aws: float
    second_vs_first: float
    restore_vs_s5cmd: float

    @property
    def base(self) -> Path:  # built once, never modified afterwards
        return BENCH_DIR / f"{self.slug}-checkpoint"

    @property
    def recipe_file(self) -> Path:  # how it was built: reused only by an identical recipe
        return BENCH_DIR / f"{self.slug}-checkpoint.json"

    @property
    def input_dir(self) -> Path:  # the file source's input: its log holds these absolute paths
        return BENCH_DIR / f"{self.slug}-input"

    @property
    def work(self) -> Path:
        return WORK_DIR / self.slug

    def section(self, name: str) -> str:
        return f"{self.slug}: {name}"


CASES = (
    Case("rocksdb", 8, "agg", 117, first_vs_aws=0.2, second_vs_first=0.25, restore_vs_s5cmd=1.2),
    Case("p200", 200, "dedup-agg", 9, first_vs_aws=0.1, second_vs_first=0.25, restore_vs_s5cmd=0.3),
)

MB = 1024 * 1024


def mb(n: int) -> str:
    return f"{n / MB:.1f}"


# ---------------------------------------------------------------- helpers


def tree_stats(root: Path) -> tuple[int, int]:
    """Files and bytes under `root`, every file (hidden checksum files included)."""
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            files += 1
            size += os.path.getsize(os.path.join(dirpath, name))
    return files, size


def last_commit(checkpoint: Path) -> int:
    commits = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    return max(commits, default=-1)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.monotonic()
    result = fn()
    return time.monotonic() - started, result


def run_tool(command: list[str], env: dict[str, str], what: str) -> float:
    """Run a peer tool; its failure is the benchmark's failure (a silent peer would make ratios meaningless)."""
    return run_tool_usage(command, env, what)[0]


def run_tool_usage(command: list[str], env: dict[str, str], what: str) -> tuple[float, float]:
    """`run_tool`, also giving the CPU seconds the tool spent: on a machine whose cores the S3 server shares, a
    client's CPU is time the server does not get."""
    ran = run_measured(command, {**os.environ, **env}, what)
    return ran.seconds, ran.cpu_s


@dataclass(frozen=True)
class Ran:
    """A finished process: its time, CPU seconds (user and system) and peak RSS (its own: wait4), what it printed."""

    seconds: float
    cpu_s: float
    peak_mb: float
    stdout: str


def run_measured(command: list[str], env: dict[str, str], what: str, cwd: Path | None = None) -> Ran:
    """Run `command` in exactly `env`; a failure (its exit code and the end of its stderr) raises. Its peak RSS is
    read with wait4, so that it is not mixed with other children of this process (a Spark JVM); its output goes to
    files, so that no pipe can fill up."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        if (code := os.waitstatus_to_exitcode(status)) != 0:
            raise RuntimeError(f"{what} failed (exit {code}):\n{err.read().strip()[-3000:]}")
        return Ran(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.read())


def venv_tool(name: str) -> str:
    found = Path(sys.executable).parent / name
    return str(found) if found.exists() else (shutil.which(name) or name)


def samples(values: list[float]) -> str:
    return "best of " + ", ".join(f"{v:.2f}" for v in values) if len(values) > 1 else f"{values[0]:.2f}"


# ---------------------------------------------------------------- the S3 server


def client_cpu_seconds() -> float:
    """CPU of this process (the engine's threads) plus its finished children (the peer tools)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class Usage:
    """What one measured step cost beyond wall time: S3 requests by operation, the body bytes the server sent
    and received, client and server CPU."""

    calls: Counter[str] = field(default_factory=Counter)
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    bytes_down: int = 0
    bytes_up: int = 0

    def describe(self, seconds: float, files: int) -> str:
        listed = ", ".join(f"{name} {count}" for name, count in self.calls.most_common()) or "not counted"
        rate = f"{self.calls.total() / seconds:.0f} requests/s; " if self.calls else ""
        per_file = f" = {1000 * self.client_cpu / files:.1f} ms/file" if files else ""
        return f"{listed}  ({rate}CPU: client {self.client_cpu:.2f} s{per_file}, moto {self.server_cpu:.2f} s)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": dict(self.calls),
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "client_cpu_s": round(self.client_cpu, 3),
            "server_cpu_s": round(self.server_cpu, 3),
        }


class S3Server:
    """moto in a child process (bench/s3_server.py) that counts the requests it serves."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.s3_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        endpoint = self._stdout.readline().strip()
        if not endpoint.startswith("http"):
            self.stop()
            raise RuntimeError("the moto server did not start")
        self.endpoint = endpoint
        self.env = {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}

    @property
    def _stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def cpu_seconds(self) -> float:
        """CPU time the server process has used (user + system), from /proc; 0 where /proc is missing."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def counts(self) -> tuple[Counter[str], Counter[str]]:
        """The requests served so far by operation, and the body bytes ("bytes_up", "bytes_down")."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("counts\n")
        self.proc.stdin.flush()
        data = json.loads(self._stdout.readline()) or {}
        return Counter(data.get("requests", {})), Counter({k: data.get(k, 0) for k in ("bytes_up", "bytes_down")})

    @contextmanager
    def phase(self) -> Iterator[Usage]:
        """Yields a Usage that holds, after the block, the requests served, the bytes moved and the CPU used
        inside it."""
        (calls, moved), server_cpu, client_cpu = self.counts(), self.cpu_seconds(), client_cpu_seconds()
        usage = Usage()
        yield usage
        calls_after, moved_after = self.counts()
        usage.calls.update(calls_after - calls)
        usage.bytes_down = moved_after["bytes_down"] - moved["bytes_down"]
        usage.bytes_up = moved_after["bytes_up"] - moved["bytes_up"]
        usage.server_cpu = self.cpu_seconds() - server_cpu
        usage.client_cpu = client_cpu_seconds() - client_cpu

    def create_bucket(self, name: str) -> None:
        EmbeddedS3(port=int(self.endpoint.rsplit(":", 1)[1])).create_bucket(name)

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=15)


@contextmanager
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- 1. the real checkpoint


def run_spark(case: Case, checkpoint: Path, first: int, count: int) -> float:
    command = [sys.executable, "-m", "bench.spark_feed", "--checkpoint", str(checkpoint)]
    command += ["--input", str(case.input_dir), "--first", str(first), "--count", str(count)]
    command += ["--partitions", str(case.partitions), "--query", case.query]
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"spark_feed failed (exit {result.returncode}):\n{result.stderr.strip()[-3000:]}")
    return time.monotonic() - started


def checkpoint_recipe(case: Case) -> dict[str, Any]:
    """Everything the pristine checkpoint depends on; the file source's log holds absolute input paths."""
    return {
        "input_dir": str(case.input_dir),
        "batches": case.batches,
        "query": case.query,
        "rows_per_batch": spark_feed.ROWS_PER_BATCH,
        "row_columns": 3,
        "key_space": spark_feed.KEY_SPACE,
        "spark_conf": spark_feed.spark_conf(case.partitions),
    }


def reusable_checkpoint(case: Case) -> bool:
    try:
        recipe = json.loads(case.recipe_file.read_text())
    except (OSError, ValueError):
        return False
    return recipe == checkpoint_recipe(case) and last_commit(case.base) == case.batches - 1


def ensure_checkpoint(case: Case, results: Results) -> Path:
    """The pristine checkpoint (built once, then reused), copied to a fresh working location."""
    if reusable_checkpoint(case):
        log(f"REUSING the checkpoint in {case.base.relative_to(ROOT)} (delete it to rebuild)")
        reused, build_s = True, 0.0
    else:
        log(f"building a RocksDB changelog checkpoint ({case.slug}) of {case.batches} batches (minutes, once)")
        building = BENCH_DIR / f"{case.slug}-checkpoint.building"
        case.recipe_file.unlink(missing_ok=True)
        for stale in (building, case.base, case.input_dir):
            shutil.rmtree(stale, ignore_errors=True)
        build_s = run_spark(case, building, 0, case.batches)
        if last_commit(building) != case.batches - 1:
            raise RuntimeError(f"the query committed up to batch {last_commit(building)}, not {case.batches - 1}")
        building.rename(case.base)  # checkpoints are relocatable; the inputs stay in the input directory
        case.recipe_file.write_text(json.dumps(checkpoint_recipe(case), indent=2))
        reused = False
        log(f"built in {build_s:.0f}s")
    shutil.rmtree(case.work, ignore_errors=True)
    work = case.work / "checkpoint"
    shutil.copytree(case.base, work)  # copy2 keeps mtimes
    files, size = tree_stats(work)
    state = [p for p in (work / "state").rglob("*") if p.is_file() and not p.name.startswith(".")]
    kinds = Counter(p.suffix or p.name for p in state)
    how = "REUSED from an earlier run" if reused else f"built in {build_s:.0f} s"
    operators = "dedup + aggregation" if case.query == "dedup-agg" else "aggregation"
    results.row(
        case.section("checkpoint"),
        "kind",
        f"RocksDB + changelog, {operators}, {case.partitions} partitions, batches 0..{last_commit(work)}, {how}",
    )
    results.row(case.section("checkpoint"), "whole checkpoint", f"{files} files, {mb(size)} MB")
    results.row(case.section("checkpoint"), "state files", ", ".join(f"{n} {k}" for k, n in kinds.most_common()))
    results.data[case.slug] = {}
    results.data[case.slug]["checkpoint"] = {
        "path": str(work),
        "reused": reused,
        "build_s": round(build_s, 1),
        "last_batch": last_commit(work),
        "files": files,
        "bytes": size,
        "state_files_by_kind": dict(kinds),
    }
    return work


# ---------------------------------------------------------------- 2. peers


@dataclass
class Sample:
    seconds: float
    usage: Usage


def best(runs: list[Sample]) -> Sample:
    return min(runs, key=lambda run: run.seconds)


def peer_uploads(case: Case, checkpoint: Path, server: S3Server, results: Results) -> float:
    """Whole-checkpoint uploads by awscli and s5cmd (interleaved); returns awscli's best time."""
    files, size = tree_stats(checkpoint)
    runs: dict[str, list[Sample]] = {"aws": [], "s5cmd": []}
    for rep in range(PEER_UPLOAD_REPEATS):
        aws = [venv_tool("aws"), "--endpoint-url", server.endpoint, "s3", "sync", str(checkpoint)]
        aws += [f"s3://{BUCKET}/{case.slug}-peer-aws-{rep}/", "--only-show-errors", "--no-progress"]
        s5 = [venv_tool("s5cmd"), "--endpoint-url", server.endpoint, "--log", "error", "cp"]
        s5 += [f"{checkpoint}/*", f"s3://{BUCKET}/{case.slug}-peer-s5-{rep}/"]
        for name, prefix, command in (("aws", f"{case.slug}-peer-aws", aws), ("s5cmd", f"{case.slug}-peer-s5", s5)):
            log(f"peer {name}: upload of the whole checkpoint ({rep + 1}/{PEER_UPLOAD_REPEATS})")
            with server.phase() as usage:
                seconds = run_tool(command, server.env, name)
            runs[name].append(Sample(seconds, usage))
            copied = sum(1 for _ in S3Storage(BUCKET, f"{prefix}-{rep}").list())
            if copied != files:
                raise RuntimeError(f"{name} copied {copied} objects of the checkpoint's {files} files")
    for name, label in (("aws", "aws s3 sync"), ("s5cmd", "s5cmd cp")):
        top = best(runs[name])
        results.row(
            case.section("peers"),
            f"{label} (whole checkpoint)",
            f"{top.seconds:.2f} s  ({samples([r.seconds for r in runs[name]])}; {files / top.seconds:.0f} files/s)",
        )
        results.row(case.section("peers"), f"{name} cost", top.usage.describe(top.seconds, files))
    results.data[case.slug]["peers"] = {
        "files": files,
        "bytes": size,
        **{name: [{"seconds": round(r.seconds, 3), **r.usage.as_dict()} for r in rs] for name, rs in runs.items()},
    }
    return best(runs["aws"]).seconds


# ---------------------------------------------------------------- 3./4. snapshots


@dataclass
class Snap:
    seconds: float
    manifest: Manifest
    usage: Usage

    def as_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "id": m.id,
            "batch_id": m.batch_id,
            "seconds": round(self.seconds, 3),
            "files": len(m.files),
            "total_bytes": m.total_bytes,
            "uploaded_files": m.uploaded_files,
            "uploaded_bytes": m.uploaded_bytes,
            "engine_timings": m.timings,
            **self.usage.as_dict(),
        }


def take_snapshots(stores: list[SnapshotStore], checkpoint: Path, server: S3Server) -> list[Snap]:
    """One snapshot of `checkpoint` into each store (independent samples of the same operation)."""
    snaps = []
    request = SnapshotRequest(job=JOB)
    for store in stores:
        with server.phase() as usage:
            started = time.monotonic()
            manifest = create_snapshot(store, open_storage(str(checkpoint)), request)
            seconds = time.monotonic() - started
        snaps.append(Snap(seconds, manifest, usage))
    return snaps


def engine_phases(timings: dict[str, float]) -> str:
    """create.py's timings; what follows the copy is the HEAD check of reused blobs and the manifest."""
    check = max(0.0, timings["total_s"] - timings["plan_s"] - timings["copy_s"])
    return f"plan {timings['plan_s']:.2f} s, copy {timings['copy_s']:.2f} s, check + commit {check:.2f} s"


def first_snapshot(
    case: Case, stores: list[SnapshotStore], checkpoint: Path, server: S3Server, aws_s: float, results: Results
) -> Snap:
    log(f"first snapshot ({len(stores)} samples, one store each)")
    snaps = take_snapshots(stores, checkpoint, server)
    top = min(snaps, key=lambda s: s.seconds)
    m = top.manifest
    files, size = tree_stats(checkpoint)
    results.row(case.section("snapshot 1"), "time", f"{top.seconds:.2f} s  ({samples([s.seconds for s in snaps])})")
    results.row(case.section("snapshot 1"), "engine phases (best)", engine_phases(m.timings))
    results.row(
        case.section("snapshot 1"),
        f"needed at batch {m.batch_id}",
        f"{len(m.files)} of {files} files, {mb(m.total_bytes)} of {mb(size)} MB",
    )
    results.row(case.section("snapshot 1"), "uploaded", f"{m.uploaded_files} files, {mb(m.uploaded_bytes)} MB")
    results.row(case.section("snapshot 1"), "cost", top.usage.describe(top.seconds, len(m.files)))
    results.targets.append(
        Target(
            case.section("snapshot 1 time / aws s3 sync"),
            top.seconds / aws_s,
            case.first_vs_aws,
            "x",
            f"{top.seconds:.2f}s vs {aws_s:.2f}s",
        )
    )
    results.data[case.slug]["snapshot1"] = {
        "checkpoint_files": files,
        "checkpoint_bytes": size,
        "samples": [s.as_dict() for s in snaps],
    }
    return top


def second_snapshot(
    case: Case, stores: list[SnapshotStore], checkpoint: Path, server: S3Server, first: Snap, results: Results
) -> list[Manifest]:
    """Returns the second snapshot's manifest in each store, in the order of `stores`."""
    start = last_commit(checkpoint) + 1
    log(f"running the query {MORE_BATCHES} more batches ({start}..{start + MORE_BATCHES - 1})")
    spark_s = run_spark(case, checkpoint, start, MORE_BATCHES)
    if last_commit(checkpoint) != start + MORE_BATCHES - 1:
        raise RuntimeError(f"expected batch {start + MORE_BATCHES - 1} committed, found {last_commit(checkpoint)}")
    log(f"the query ran in {spark_s:.0f}s; second snapshot ({len(stores)} samples)")
    snaps = take_snapshots(stores, checkpoint, server)
    top = min(snaps, key=lambda s: s.seconds)
    m = top.manifest
    known = {(f.path, f.sha256) for f in first.manifest.files}
    new = [f for f in m.files if (f.path, f.sha256) not in known]
    new_bytes = sum(f.size for f in new)
    uploaded = max(s.manifest.uploaded_bytes for s in snaps)
    results.row(case.section("snapshot 2"), "time", f"{top.seconds:.2f} s  ({samples([s.seconds for s in snaps])})")
    results.row(case.section("snapshot 2"), "engine phases (best)", engine_phases(m.timings))
    needed = f"{len(m.files)} files, {mb(m.total_bytes)} MB"
    results.row(case.section("snapshot 2"), f"needed at batch {m.batch_id}", needed)
    results.row(case.section("snapshot 2"), "new since snapshot 1", f"{len(new)} files, {new_bytes} bytes")
    results.row(case.section("snapshot 2"), "uploaded", f"{m.uploaded_files} files, {uploaded} bytes")
    results.row(case.section("snapshot 2"), "cost", top.usage.describe(top.seconds, len(m.files)))
    results.targets.append(
        Target(
            case.section("snapshot 2 uploaded / new bytes"),
            uploaded / max(new_bytes, 1),
            SECOND_UPLOAD_VS_NEW,
            "x",
            f"{uploaded} vs {new_bytes} bytes",
        )
    )
    results.targets.append(
        Target(
            case.section("snapshot 2 time / snapshot 1"),
            top.seconds / first.seconds,
            case.second_vs_first,
            "x",
            f"{top.seconds:.2f}s vs {first.seconds:.2f}s",
        )
    )
    results.data[case.slug]["snapshot2"] = {
        "spark_s": round(spark_s, 1),
        "new_files": len(new),
        "new_bytes": new_bytes,
        "samples": [s.as_dict() for s in snaps],
    }
    return [s.manifest for s in snaps]


# ---------------------------------------------------------------- 5. restore


def check_same_files(restored: Path, downloaded: Path, paths: list[str]) -> None:
    """Both copies hold exactly the planned files, byte for byte: otherwise the timings compare nothing."""
    for root in (restored, downloaded):
        files, _ = tree_stats(root)
        if files != len(paths):
            raise RuntimeError(f"{root} holds {files} files, the restore plan {len(paths)}")
    different = [p for p in paths if not filecmp.cmp(restored / p, downloaded / p, shallow=False)]
    if different:
        raise RuntimeError(f"{len(different)} restored files differ from the peer's download, e.g. {different[0]}")


def restore_vs_s5cmd(
    case: Case, store: SnapshotStore, manifest: Manifest, checkpoint: Path, server: S3Server, results: Results
) -> None:
    log("bringing the s5cmd peer copy up to date with the 10 new batches (not timed)")
    peer = f"s3://{BUCKET}/{case.slug}-peer-s5-0"
    sync = [
        venv_tool("s5cmd"),
        "--endpoint-url",
        server.endpoint,
        "--log",
        "error",
        "sync",
        f"{checkpoint}/*",
        f"{peer}/",
    ]
    run_tool(sync, server.env, "s5cmd sync")

    engine: list[Sample] = []
    plan_s: list[float] = []
    peer_runs: list[Sample] = []
    paths: list[str] = []
    for rep in range(REPEATS):
        log(f"restore of snapshot 2, then s5cmd download of the same files ({rep + 1}/{REPEATS})")
        target = case.work / f"restore-engine-{rep}"
        with server.phase() as usage:
            started = time.monotonic()
            plan = plan_restore(store, JOB, manifest.id, open_storage(str(target)))
            planned = time.monotonic()
            execute_restore(store, plan)
            seconds = time.monotonic() - started
        engine.append(Sample(seconds, usage))
        plan_s.append(planned - started)
        paths = [f.path for f in plan.files]

        downloaded = case.work / f"restore-s5cmd-{rep}"
        run_file = case.work / "s5cmd-restore.txt"
        run_file.write_text("".join(f"cp {peer}/{path} {downloaded}/{path}\n" for path in paths))
        command = [venv_tool("s5cmd"), "--endpoint-url", server.endpoint, "--log", "error", "run", str(run_file)]
        with server.phase() as usage:
            seconds = run_tool(command, server.env, "s5cmd run")
        peer_runs.append(Sample(seconds, usage))
        check_same_files(target, downloaded, paths)

    ours, theirs = best(engine), best(peer_runs)
    _, size = tree_stats(case.work / "restore-engine-0")
    results.row(
        case.section("restore"),
        "engine (plan + execute)",
        f"{ours.seconds:.2f} s  ({samples([r.seconds for r in engine])}; plan {min(plan_s):.2f} s; "
        f"{len(paths)} files, {mb(size)} MB)",
    )
    results.row(case.section("restore"), "engine cost", ours.usage.describe(ours.seconds, len(paths)))
    results.row(
        case.section("restore"),
        "s5cmd run (same files)",
        f"{theirs.seconds:.2f} s  ({samples([r.seconds for r in peer_runs])}; byte-identical result)",
    )
    results.row(case.section("restore"), "s5cmd cost", theirs.usage.describe(theirs.seconds, len(paths)))
    results.targets.append(
        Target(
            case.section("restore time / s5cmd download"),
            ours.seconds / theirs.seconds,
            case.restore_vs_s5cmd,
            "x",
            f"{ours.seconds:.2f}s vs {theirs.seconds:.2f}s",
        )
    )
    results.data[case.slug]["restore"] = {
        "files": len(paths),
        "bytes": size,
        "plan_s": plan_s,
        "engine": [{"seconds": round(r.seconds, 3), **r.usage.as_dict()} for r in engine],
        "s5cmd": [{"seconds": round(r.seconds, 3), **r.usage.as_dict()} for r in peer_runs],
    }


# ---------------------------------------------------------------- 6. memory of a 100k-file snapshot


def write_synthetic_checkpoint(root: Path, files: int) -> None:
    """A stateless-looking checkpoint: 3 committed batches and `files` small files under sources/0/.
    The offsets hold a rate-source-like line (no logOffset), so checkpoint.py keeps every sources/ file."""
    for directory in ("offsets", "commits", "sources/0"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text('{"id":"00000000-0000-4000-8000-000000000100"}')
    for batch in range(3):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch, "conf": {}}
        (root / f"offsets/{batch}").write_text(f"v1\n{json.dumps(meta)}\n{batch * 10}")
        (root / f"commits/{batch}").write_text('v1\n{"nextBatchWatermarkMs":0}')
    sources = root / "sources/0"
    for i in range(files):
        (sources / f"part-{i:06d}.json").write_text(f'v1\n{{"path":"file:///data/in/part-{i:06d}.json","n":{i}}}\n')


def ensure_synthetic_checkpoint() -> tuple[Path, str]:
    """The 100,000-file checkpoint, written once (deleting 100k files costs as much as writing them)."""
    sources = SYNTHETIC_CHECKPOINT / "sources" / "0"
    if sources.is_dir() and sum(1 for _ in os.scandir(sources)) == SYNTHETIC_FILES:
        log(f"REUSING the synthetic checkpoint in {SYNTHETIC_CHECKPOINT.relative_to(ROOT)}")
        return SYNTHETIC_CHECKPOINT, "reused"
    log(f"writing a synthetic checkpoint of {SYNTHETIC_FILES} files (once)")
    building = BENCH_DIR / "synthetic-checkpoint.building"
    for stale in (building, SYNTHETIC_CHECKPOINT):
        shutil.rmtree(stale, ignore_errors=True)
    seconds, _ = timed(lambda: write_synthetic_checkpoint(building, SYNTHETIC_FILES))
    building.rename(SYNTHETIC_CHECKPOINT)
    return SYNTHETIC_CHECKPOINT, f"written in {seconds:.1f} s"


def copy_peer(checkpoint: Path) -> float:
    """`cp -r` of the whole checkpoint into a fresh directory, removed afterwards (not timed)."""
    target = WORK_DIR / "synthetic-cp"
    shutil.rmtree(target, ignore_errors=True)
    seconds = run_tool(["cp", "-r", str(checkpoint), str(target)], {}, "cp -r")
    shutil.rmtree(target)
    return seconds


def synthetic_memory(results: Results) -> None:
    checkpoint, how = ensure_synthetic_checkpoint()
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    store = WORK_DIR / "synthetic-store"
    shutil.rmtree(store, ignore_errors=True)
    log("peer: cp -r of the 100,000-file checkpoint")
    cp_s = [copy_peer(checkpoint)]
    log("snapshot of the 100,000-file checkpoint into a local store, in a child process")
    probed = run_measured(
        [sys.executable, "-m", "bench.memory_probe", str(checkpoint), str(store)], dict(os.environ), "the probe", ROOT
    )
    stdout, rusage_mb = probed.stdout, probed.peak_mb
    log("peer: cp -r again (best of two: the page cache is as warm as for the snapshot)")
    cp_s.append(copy_peer(checkpoint))
    shutil.rmtree(store)
    probe = json.loads(stdout.strip().splitlines()[-1])
    peak = max(probe["peak_rss_mb"], rusage_mb)
    if probe["files"] < SYNTHETIC_FILES:
        raise RuntimeError(f"the synthetic snapshot holds {probe['files']} files, expected >= {SYNTHETIC_FILES}")
    results.row(
        "100k files",
        "snapshot to a local store",
        f"{probe['seconds']:.1f} s, {probe['files']} files, {mb(probe['total_bytes'])} MB, "
        f"{probe['files'] / probe['seconds']:.0f} files/s (checkpoint {how})",
    )
    results.row("100k files", "engine phases", engine_phases(probe["timings"]))
    results.row("100k files", "cp -r (same checkpoint)", f"{min(cp_s):.1f} s  ({samples(cp_s)})")
    results.targets.append(
        Target(
            "100k-file snapshot time / cp -r",
            probe["seconds"] / min(cp_s),
            SYNTHETIC_VS_CP,
            "x",
            f"{probe['seconds']:.1f}s vs {min(cp_s):.1f}s",
        )
    )
    results.row(
        "100k files",
        "peak RSS",
        f"{peak:.0f} MB (VmHWM {probe['peak_rss_mb']:.0f}, wait4 {rusage_mb:.0f}; "
        f"before the snapshot {probe['baseline_rss_mb']:.0f})",
    )
    results.targets.append(
        Target("100k-file snapshot peak RSS", peak, PEAK_RSS_MB, "MB", f"snapshot {probe['seconds']:.1f}s")
    )
    results.data["synthetic"] = {
        **probe,
        "cp_s": cp_s,
        "checkpoint": how,
        "rusage_maxrss_mb": round(rusage_mb, 1),
        "peak_rss_mb": peak,
    }


# ---------------------------------------------------------------- report


def run_case(case: Case, server: S3Server, results: Results) -> None:
    checkpoint = ensure_checkpoint(case, results)
    stores = [SnapshotStore(open_storage(f"s3://{BUCKET}/{case.slug}-store-{i}")) for i in range(REPEATS)]
    aws_s = peer_uploads(case, checkpoint, server, results)
    first = first_snapshot(case, stores, checkpoint, server, aws_s, results)
    second = second_snapshot(case, stores, checkpoint, server, first, results)
    restore_vs_s5cmd(case, stores[0], second[0], checkpoint, server, results)
    shutil.rmtree(case.work)  # tens of thousands of files: not kept between runs


def main() -> None:
    """The 100,000-file snapshot first, then the cases; the report is printed and written even when the run
    is interrupted (Ctrl-C) part-way, with what was measured by then."""
    started = time.monotonic()
    results = Results()
    chosen = os.environ.get("BENCH_CASES", " ".join(["synthetic", *(c.slug for c in CASES)])).split()
    try:
        if "synthetic" in chosen:
            synthetic_memory(results)
        with s3_server() as server:
            os.environ.update(server.env)  # the engine's boto3 client reads AWS_ENDPOINT_URL and the credentials
            server.create_bucket(BUCKET)
            for case in CASES:
                if case.slug in chosen:
                    run_case(case, server, results)
    finally:
        results.data["wall_s"] = round(time.monotonic() - started, 1)
        results.row("run", "wall time", f"{results.data['wall_s']:.0f} s")
        report(results, RESULTS)


if __name__ == "__main__":
    main()
