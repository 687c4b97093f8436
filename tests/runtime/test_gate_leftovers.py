"""A gate an ended upgrade left on a running deployment, taken back by `savepoints upgrade JOB --abort`, without Spark:
a thread stands in for the old version's driver with the runtime's own pieces (its status board, heartbeat, control
channel and the gate's decisions, spark_jobs/runtime/gate.py), as the runner wires them between two batches. And a
later attempt of a driver starts from the gate its status recorded (runner.py `_initial_gate`). The real thing, with
drivers and a table: tests/e2e/test_blue_green.py."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import BLUE, SOLE, Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import Kind, Manifest, SnapshotStatus, Trigger
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
from spark_jobs.runtime.args import parse_args
from spark_jobs.runtime.control import ControlChannel
from spark_jobs.runtime.gate import ACTIONS, COMMIT_LOCK, DeltaTarget, GatedWriter, GateState
from spark_jobs.runtime.runner import Runner
from spark_jobs.runtime.status import StatusBoard
from tests.support.jobs import write_jobs

REPO = Path(__file__).resolve().parents[2]

UPGRADE = "up-20260101T000000000Z-aaaa"


@contextmanager
def driver(deployments: Deployments, deployment: Deployment, gate: GateState) -> Iterator[GateState]:
    """The old version's driver between two batches: a fresh heartbeat, its gate requests decided as they come."""
    board = StatusBoard(deployments, deployment.job, deployment.id, DeploymentStatus(State.RUNNING, time.time()))
    writer = GatedWriter(
        None,  # type: ignore[arg-type]  # deciding needs no Spark
        DeltaTarget("/table"),
        gate,
        deployment.checkpoint,
        lambda state: board.update(gate=state.to_dict()),
        lambda request, answer: board.answer(request.id, answer),
        lambda upgrade: Upgrades(deployments.storage).gate_refusal(deployment.job, upgrade),
    )
    board.update(gate=gate.to_dict())
    control = ControlChannel(deployments, deployment.job, deployment.id)
    done = threading.Event()

    def serve() -> None:
        while not done.wait(0.1):
            board.beat()
            if (request := control.next_request(*ACTIONS)) is not None:
                writer.handle(request)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield gate
    finally:
        done.set()
        thread.join()


def test_abort_takes_an_ended_upgrades_gate_back_and_refuses_where_rows_were_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = str(write_jobs(tmp_path))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    deployments, upgrades = Deployments(job.store.storage), Upgrades(job.store.storage)
    old = Deployment("dp-20260101T000000000Z-0001", "orders", "v1", str(tmp_path / "ck"))
    deployments.put(old)
    ended = Upgrade(UPGRADE, "orders", "v2", mode="blue_green", old_deployment=old.id, savepoint="sp-1")
    ended.move(Phase.FAILED, "the recovery could not finish")  # a FAILED upgrade retries its recovery: not this
    ended.move(Phase.ABORTED, "ended, with the old version still gated")
    upgrades.put(ended)

    with driver(deployments, old, GateState("window_end", BLUE, until=60_000, upgrade=UPGRADE)) as gate:
        assert main(["upgrade", "orders", "--abort", "--jobs", jobs]) == 11  # it stays an ABORTED upgrade
        said = capsys.readouterr().out
        assert f"{old.id} ungated: it writes every window again" in said, said
        assert (gate.role, gate.until, gate.upgrade) == (SOLE, None, None) and UPGRADE in gate.withdrawn
        status = deployments.status("orders", old.id)
        assert status is not None and status.answers[f"rq-ungate-{UPGRADE}"] == "accepted"
        assert main(["upgrade", "orders", "--abort", "--jobs", jobs]) == 11
        assert f"nothing of upgrade {UPGRADE} is left in a running deployment" in capsys.readouterr().out
        assert gate.role == SOLE, "doing it again changes nothing"

    again = Deployment("dp-20260101T000000000Z-0002", "orders", "v1", str(tmp_path / "ck2"))
    deployments.put(again)
    dropped = Upgrade("up-20260101T000000000Z-bbbb", "orders", "v2", mode="blue_green", old_deployment=again.id)
    dropped.savepoint = "sp-2"
    upgrades.put(dropped.move(Phase.ABORTED, "ended"))
    with driver(deployments, again, GateState("window_end", BLUE, until=60_000, dropped=7, upgrade=dropped.id)) as gate:
        assert main(["upgrade", "orders", "--abort", "--jobs", jobs]) == 4
        err = capsys.readouterr().err
        assert f"deployment {again.id} keeps the gate of upgrade {dropped.id}" in err and "left 7 rows" in err, err
        assert "--restore sp-2 --rewind-sink" in err
        assert gate.role == BLUE and gate.dropped == 7, "refused: a rollback, not an ungate, brings those rows back"


def test_a_later_attempt_of_a_driver_starts_from_the_gate_its_status_recorded(tmp_path: Path) -> None:
    """YARN's second driver attempt runs the same command: its arguments say staging (or nothing), its status says
    what the first attempt applied and took back."""
    jobs = str(write_jobs(tmp_path))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    deployments = Deployments(job.store.storage)
    recorded = GateState("window_end", BLUE, until=60_000, dropped=3, upgrade=UPGRADE, withdrawn=["up-0"])
    status = DeploymentStatus(State.RUNNING, time.time(), gate=recorded.to_dict(), handled_requests=["rq-gate-x"])
    deployments.write_status("orders", "dp-1", status)
    argv = ["--store", job.store.uri, "--job", "orders", "--deployment", "dp-1", "--checkpoint", "/ck"]
    argv += ["--trigger-interval", "1 second", "--delivery", "exactly-once", "--gate-staging", "/staging"]
    runner = Runner(lambda spark, args: None, *parse_args(argv))  # type: ignore[arg-type,return-value]
    assert runner._initial_gate("window_end") == recorded
    assert runner.control._seen == {"rq-gate-x"}
    fresh = Runner(lambda spark, args: None, *parse_args([*argv[:5], "dp-2", *argv[6:]]))  # type: ignore[arg-type,return-value]
    assert fresh._initial_gate("window_end") == GateState("window_end", "staging", staging="/staging")


def test_a_snapshot_taken_while_gated_is_restored_writing_every_window_after_its_lower_bound() -> None:
    def taken(**gate: int | None) -> Manifest:
        gated = {"column": "window_end", **gate}
        return Manifest(
            "sp-1", "orders", Kind.SAVEPOINT, Trigger.MANUAL, SnapshotStatus.COMPLETED, "/ck", "t", gate=gated
        )

    blue = taken(after=None, until=60_000)
    assert blue.restored_gate is None, "the old version's upper bound is never kept"
    note = str(blue.gate_note())
    assert "until 1970-01-01T00:01:00Z" in note and "a restore writes every window" in note
    green = taken(after=60_000, until=None)
    assert green.restored_gate == {"after": 60_000}
    assert "a restore writes only the windows ending after 1970-01-01T00:01:00Z" in str(green.gate_note())
    assert taken(after=None, until=None).gate_note() is None


def test_the_two_drivers_of_a_local_table_take_turns_to_commit(tmp_path: Path) -> None:
    """Hadoop's local file system creates a Delta log version by a check and then a rename, which two JVMs can both
    pass: the blue and green drivers take turns through a lock beside the log. Another process's commit waits while
    one holds it, and goes on once it is released, or once its holder died."""
    table = f"file:{tmp_path / 'table'}"
    waiter = [
        sys.executable,
        "-c",
        "import sys; from spark_jobs.runtime.gate import commit_lock\n"
        "with commit_lock(sys.argv[1]): print('committing', flush=True)",
        table,
    ]
    for release in ("release", "die"):
        holder = subprocess.Popen(
            [sys.executable, "-c", "import sys; from spark_jobs.runtime.gate import commit_lock\n"
             "with commit_lock(sys.argv[1]):\n print('held', flush=True); sys.stdin.readline()", table],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        other = subprocess.Popen(waiter, stdout=subprocess.PIPE, text=True, cwd=REPO)
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(timeout=2)  # its commit waits: a wrong lock would let it through here
        if release == "release":
            holder.communicate("\n", timeout=30)
        else:
            holder.kill()
            holder.wait()
        assert other.communicate(timeout=30)[0].strip() == "committing"
    assert (tmp_path / "table" / COMMIT_LOCK).exists() and not (tmp_path / "table" / "_delta_log").exists()
