"""One writer across machines (issue 51): a declared job's driver and the `savepoints` commands that decide about it
run in different PID namespaces of this host, as an Airflow worker in another container (or on another machine)
would: `unshare -u -p -f --mount-proc` (its own host name and process table). Real processes: spark-submit drivers
running tests/scripts/counts.py (JSON event files -> a windowed count -> Spark's file sink) as it is, the store and
the output on local disk, events fed all along.

1. A healthy driver seen from the other namespace (its pid means nothing there) is not restarted, and a deploy
   beside it is refused: its heartbeat speaks for it.
2. The driver's process group is SIGSTOPped until its heartbeat is stale (a long GC pause, a partitioned machine).
   `savepoints apply` in the other namespace cannot kill it: it fences it (the job's writers record leaves it out),
   waits until the fence holds, and restarts the job from its latest state. Then SIGCONT: the old driver wakes,
   finds itself fenced before its next commit, commits nothing more (its checkpoint's offsets and commits do not
   change) and ends FAILED (FENCED). Every (user, window) of the output is written once, with exactly the events
   fed for it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.fence import FENCED
from airflow_plugin.core.records.deployment import State
from airflow_plugin.core.records.writers import read_writers
from devtools.windowed import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow(seconds=150)]

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "counts.py"
USERS = ("ann", "bob", "cy")
START = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)
ELSEWHERE = ["unshare", "-u", "-p", "-f", "--mount-proc"]  # another host name, another process table


class Feed:
    """Event files, one per round: every user one event a minute of event time, the minutes moving on, so that
    windows close behind the watermark. Keeps what it fed per (user, window start)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True)
        self.fed: Counter[tuple[str, str]] = Counter()
        self.round = 0

    def more(self, rounds: int = 1) -> None:
        for _ in range(rounds):
            minute = START + timedelta(minutes=self.round)
            lines = []
            for seq, user in enumerate(USERS):
                at = minute + timedelta(seconds=10 + seq)
                lines.append(json.dumps({"user": user, "country": "x", "event_time": at.isoformat(), "seq": seq}))
                self.fed[(user, minute.strftime("%Y-%m-%dT%H:%M"))] += 1
            staged = self.directory / f".round-{self.round:04d}.json"
            staged.write_text("\n".join(lines) + "\n")
            staged.rename(self.directory / f"round-{self.round:04d}.json")  # whole files only: Spark lists them
            self.round += 1


def _written(output: Path) -> Counter[tuple[str, str]]:
    """Every row the file sink committed (its log's files only), per (user, window start)."""
    rows: Counter[tuple[str, str]] = Counter()
    listed = set()
    for entry in sorted((output / "_spark_metadata").glob("[0-9]*")):
        for line in entry.read_text().splitlines()[1:]:
            listed.add(Path(json.loads(line)["path"].removeprefix("file:")).name)
    for part in output.glob("part-*"):
        if part.name not in listed:
            continue
        for line in part.read_text().splitlines():
            row = json.loads(line)
            rows[(row["user"], row["window_start"][:16])] += row["events"]
    return rows


def _cli(*args: str, env: dict[str, str], elsewhere: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "airflow_plugin", *args]
    return subprocess.run(
        [*ELSEWHERE, *command] if elsewhere else command, env=env, capture_output=True, text=True, timeout=300
    )


def _newest(ctx: JobContext) -> str:
    return ctx.deployments.list(ctx.name)[-1].id


def _state(ctx: JobContext, deployment_id: str) -> State | None:
    status = ctx.deployments.status(ctx.name, deployment_id)
    return status.state if status else None


def _committed(checkpoint: Path) -> list[str]:
    return sorted(p.name for d in ("offsets", "commits") for p in (checkpoint / d).glob("[0-9]*"))


def test_a_driver_paused_past_its_heartbeat_is_fenced_by_a_restart_from_another_machine(tmp_path: Path) -> None:
    if subprocess.run([*ELSEWHERE, "true"], check=False).returncode != 0:
        pytest.fail(
            "`unshare -u -p -f --mount-proc` is refused here: the test needs root (as CI runs) to be another machine"
        )
    feed = Feed(tmp_path / "in")
    output = tmp_path / "out"
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        f"""
[jobs.counts]
store = "{tmp_path / "store"}"
checkpoint_root = "{tmp_path / "checkpoints"}"
log_dir = "{tmp_path / "logs"}"
trigger_interval = "1 second"
heartbeat_timeout = 12
conf = {{ "spark.sql.shuffle.partitions" = "2" }}
args = ["--input", "{feed.directory}", "--output", "{output}"]
versions.v1 = {{ script = "{SCRIPT}" }}
desired = {{ version = "v1" }}
restart = {{ delay = 0 }}
"""
    )
    env = {**os.environ, "SAVEPOINTS_JOBS": str(jobs)}
    ctx = Settings(jobs_file=str(jobs)).resolve().job("counts")
    feed.more(3)
    elsewhere_driver: subprocess.Popen[bytes] | None = None
    first = None
    try:
        applied = _cli("apply", "counts", env=env)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        first = ctx.deployments.list(ctx.name)[-1]
        wait_for(lambda: ((ctx.deployments.status("counts", first.id) or _nothing).last_batch_id or 0) >= 1, "batches")
        feed.more(2)

        # 1. seen from another PID namespace, the healthy driver is RUNNING, not LOST: nothing to do, nothing beside
        looked = _cli("apply", "counts", "--dry-run", env=env, elsewhere=True)
        assert "NOTHING" in looked.stdout, looked.stdout + looked.stderr
        beside = _cli("deploy", "counts", "--restore", "latest-state", env=env, elsewhere=True)
        assert beside.returncode != 0 and "already has deployment" in beside.stderr, beside.stdout + beside.stderr
        assert len(ctx.deployments.list(ctx.name)) == 1

        # 2. paused past its heartbeat timeout; the other machine's apply fences it and restarts the job
        os.killpg(first.launcher["pid"], signal.SIGSTOP)
        paused_at = time.monotonic()
        wait_for(lambda: (ctx.deployments.status("counts", first.id) or _nothing).age() > 12.5, "a stale heartbeat")
        before, written_before = _committed(Path(first.checkpoint)), _written(output)
        feed.more(3)
        looked = _cli("status", "counts", "--json", env=env, elsewhere=True)  # LOST; nobody there sees if it runs
        assert looked.returncode == 0, looked.stdout + looked.stderr
        row = next(r for r in json.loads(looked.stdout) if r["deployment"] == first.id)
        assert (row["state"], row["driver"]) == ("LOST", "cannot tell"), row
        beside = _cli("deploy", "counts", "--restore", "latest-state", env=env, elsewhere=True)
        assert beside.returncode == 4 and "LOST" in beside.stderr, beside.stdout + beside.stderr  # may still run
        # the other machine's apply launches the new driver in its namespace: the namespace lives on with it
        elsewhere_driver = subprocess.Popen(
            [*ELSEWHERE, "bash", "-c", f"{sys.executable} -m airflow_plugin apply counts; exec sleep 600"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(lambda: _newest(ctx) != first.id, "the restart's deployment", timeout=240)
        second = _newest(ctx)
        wait_for(lambda: _state(ctx, second) is State.RUNNING, "the new driver to run", timeout=240)
        writers, _ = read_writers(ctx.store.storage, "counts")  # admitted before its launch
        assert not writers.admits(first.id) and writers.admits(second), writers
        assert first.id in writers.fenced
        assert time.monotonic() - paused_at > 12 + 8  # stale (12 s), then fenced (two thirds of 12 s) before it
        feed.more(3)
        start_batch = (ctx.deployments.status("counts", second) or _nothing).last_batch_id or 0
        wait_for(
            lambda: ((ctx.deployments.status("counts", second) or _nothing).last_batch_id or 0) >= start_batch + 2,
            "the new driver's batches",
        )

        # the old driver wakes: fenced before its next commit, it writes nothing more and ends FAILED (FENCED)
        os.killpg(first.launcher["pid"], signal.SIGCONT)
        feed.more(2)
        wait_for(lambda: _state(ctx, first.id) is State.FAILED, "the woken driver to end", timeout=120)
        ended = ctx.deployments.status("counts", first.id)
        assert ended is not None and ended.error_class == FENCED, ended
        wait_for(lambda: subprocess.run(["kill", "-0", str(first.launcher["pid"])]).returncode != 0, "its exit")
        assert _committed(Path(first.checkpoint)) == before  # nothing written after its pause
        feed.more(4)
        wait_for(lambda: ((ctx.deployments.status("counts", second) or _nothing).last_batch_id or 0) >= 8, "more")

        written = _written(output)
        assert written, "no window was written"
        for key, events in written.items():
            assert events == feed.fed[key], f"{key}: {events} events written, {feed.fed[key]} fed"
        assert max(k[1] for k in written) > max(k[1] for k in written_before or [("", "")]), written  # the restart's
    finally:
        if first is not None:
            with _suppressed():
                os.killpg(first.launcher["pid"], signal.SIGCONT)
        for deployment in ctx.deployments.list(ctx.name):
            with _suppressed():
                os.killpg(deployment.launcher["pid"], signal.SIGKILL)
        if elsewhere_driver is not None:
            os.killpg(elsewhere_driver.pid, signal.SIGKILL)  # the namespace's init: everything in it ends with it
            elsewhere_driver.wait()


class _Nothing:
    last_batch_id = None

    def age(self) -> float:
        return 0.0


_nothing = _Nothing()


def _suppressed() -> contextlib.AbstractContextManager[None]:
    return contextlib.suppress(ProcessLookupError, KeyError, PermissionError)
