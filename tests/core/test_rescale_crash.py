"""A rescale of the reconcile loop (`savepoints apply`) through real processes: a stand-in driver (tests/support/jobs.py
BUSY_JOB: spark-submit, no Spark session) whose heartbeat says it falls behind, rescaled from local[1] to local[2]
through a stop_restore upgrade of its running version.

1. `apply` SIGKILLed at each step of the rescale that matters, each retry killed at the next one: right after it
   recorded the rescale (nothing begun), right after the upgrade record was created (nothing launched), right after
   the new driver was launched (the upgrade does not know it yet), right after the cutover, and right after the
   upgrade ended DONE (its outcome not recorded). Each kill lands right after a write took effect (the fault proxy
   holds back its answer). The last apply finishes the same rescale: counted once, its outcome recorded once, one
   driver at the new size, one writer.
2. The rescale carried out by an `apply` in another PID namespace (`unshare -p -f --mount-proc`: another Airflow
   worker's machine, where the driver's process cannot be seen): the old driver is stopped through the store, the
   new one admitted once it said so, one driver at the new size, one writer.
3. A stop/restore whose new driver is still warming up when its start timeout passes aborts before the old driver
   is asked to stop; and an abort after the launch step was killed before it named the driver it launched stops
   that driver too.
4. The old driver paused (SIGSTOP) at the rescale's cutover: the rescale aborts, and the driver runs on when it
   wakes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_plugin.cli.main import main
from airflow_plugin.core.autoscale.decide import Rescale
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.launcher import process_seen
from airflow_plugin.core.jobs.observe import state_of
from airflow_plugin.core.layout import reconcile_key
from airflow_plugin.core.process import Liveness
from airflow_plugin.core.reconcile import record as records
from airflow_plugin.core.reconcile.apply import _record_rescale, apply_job, loop_context, next_step
from airflow_plugin.core.reconcile.plan import Action
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.writers import read_writers
from airflow_plugin.core.timestamps import epoch_of, utc_stamp
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
from devtools.embedded_s3 import EmbeddedS3
from devtools.faulty_s3 import FaultyS3
from devtools.forked import cli
from devtools.windowed import wait_for
from tests.support.jobs import BUSY_JOB, kill_every_deployment, write_jobs

# falls behind at local[1]; rescaled once to its max, local[2] (3 state partitions: no repartition), then kept
AUTOSCALED = (
    'spark_master = "local[1]"\ndesired = { version = "v1", upgrade_mode = "stop_restore" }\n'
    'autoscale = { max = 2, window = "30s", scale_down_window = "60s", cooldown = "10m" }'
)


def _declare(tmp_path: Path, store: str) -> tuple[str, JobContext]:
    app = tmp_path / "busy.py"
    app.write_text(BUSY_JOB)
    jobs = str(write_jobs(tmp_path, application=str(app), extra=f'{AUTOSCALED}\nstore = "{store}"'))
    return jobs, Settings(jobs_file=jobs).resolve().job("orders")


def _live(job: JobContext) -> list[str]:
    return [d.id for d in job.deployments.list("orders") if state_of(job, d).live]


def _size(job: JobContext, deployment_id: str) -> int | None:
    deployment = job.deployments.get("orders", deployment_id)
    return job.spec.size_of(deployment.master, deployment.spark_conf)


def _batch(job: JobContext, deployment_id: str) -> int:
    status = job.deployments.status("orders", deployment_id)
    return (status.last_batch_id if status else None) or -1


def _ends_at_one_driver_of_size_two(job: JobContext, old: str) -> str:
    """The job after its rescale: one live driver, at local[2], the old one's process gone, and the job's writers
    record naming the new one alone, the old one left out. Returns the new deployment."""
    [new] = _live(job)
    assert new != old and _size(job, new) == 2 and _size(job, old) == 1
    assert state_of(job, job.deployments.get("orders", old)) is State.STOPPED
    launcher = job.deployments.get("orders", old).launcher
    wait_for(lambda: process_seen(launcher) is Liveness.GONE, "the old driver's exit")
    writers, _ = read_writers(job.store.storage, "orders")
    assert list(writers.writers) == [new] and old in writers.fenced, writers
    return new


# ------------------------------------------------------------- a rescale its apply left pending, without a driver


def _pending(job: JobContext, at: float) -> None:
    """The record as an apply killed right after it recorded a rescale 1 -> 2 leaves it; a deployment at local[1]
    behind (its load: BUSY_JOB's)."""
    record = records.read(job.store.storage, "orders")
    record.rescales, record.rescales_total = [Rescale(at, 1, 2, "behind", {})], 1
    records.write(job.store.storage, record)
    deployment = Deployment("dp-20260101T000000000Z-0001", "orders", "v1", "cp", master="local[1]")
    deployment.spark_conf = {"spark.sql.shuffle.partitions": "3"}
    job.deployments.put(deployment)
    now = time.time()
    buckets = range(int(now) - 300, int(now), 10)
    load = [{"t": t, "batches": 1, "rows": 100, "busy_ms": 10_000, "backlog": None} for t in buckets]
    job.deployments.write_status("orders", deployment.id, DeploymentStatus(State.RUNNING, now, load=load))


def test_a_rescale_recorded_by_a_killed_apply_goes_on_within_its_cooldown_counted_once(tmp_path: Path) -> None:
    _, job = _declare(tmp_path, "store")
    at = time.time() - 5
    _pending(job, at)
    step = next_step(loop_context(job))
    assert (step.action, step.size, step.from_size, step.rescaled_at) == (Action.RESCALE, 2, 1, at), step
    assert "was recorded: it goes on" in step.reason and step.mode == "stop_restore", step.reason
    again = _record_rescale(loop_context(job))
    assert again is not None and again.rescaled_at == step.rescaled_at
    assert records.read(job.store.storage, "orders").rescales_total == 1, "not recorded again"

    _pending(job, time.time() - 700)  # older than its cooldown (10 minutes): the autoscaler decides anew
    assert next_step(loop_context(job)).rescaled_at is None


def test_a_rescale_whose_upgrade_ended_unrecorded_has_its_outcome_recorded_once(tmp_path: Path) -> None:
    """An apply killed after the rescale's upgrade ended, before it recorded the end: the next one records it (and
    begins nothing), the one after it sees the cooldown."""
    _, job = _declare(tmp_path, "store")
    at = time.time() - 30
    _pending(job, at)
    ended = Upgrade(id="up-1", job="orders", to_version="v1", size=2, from_size=1, mode="stop_restore")
    ended.request_id, ended.phase = Rescale(at, 1, 2, "", {}).request_id, Phase.DONE
    ended.created_at, ended.cutover_at = utc_stamp(at + 1), utc_stamp(at + 11)
    Upgrades(job.store.storage).put(ended)
    step = next_step(loop_context(job))
    assert step.action is Action.RESCALE and "ended DONE (upgrade up-1)" in step.reason, step.reason
    applied = apply_job(job)
    assert applied.ok and "rescale of v1 from 1 to 2 (upgrade up-1, stop_restore) done" in applied.outcome, applied
    [rescale] = records.read(job.store.storage, "orders").rescales
    assert (rescale.upgrade, rescale.outcome, rescale.seconds) == ("up-1", "DONE", pytest.approx(10, abs=0.01))
    assert Upgrades(job.store.storage).ids("orders") == ["up-1"], "nothing begun"
    assert next_step(loop_context(job)).action is Action.NOTHING
    assert records.read(job.store.storage, "orders").rescales_total == 1


# -------------------------------------------------------------------------------------- real apply processes


@pytest.mark.slow(seconds=60)
def test_apply_killed_at_each_step_of_a_rescale_is_finished_by_the_next_counted_once(
    s3_server: EmbeddedS3, s3_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs, job = _declare(tmp_path, s3_store)
    upgrades = Upgrades(job.store.storage)

    def applied() -> dict[str, object]:
        assert main(["apply", "orders", "--jobs", jobs, "--json"]) == 0
        [row] = json.loads(capsys.readouterr().out)["jobs"]
        return row

    def apply_killed_at(number: int, to: str) -> None:
        """An apply SIGKILLed right after its `number`-th write to a key containing `to` took effect."""
        reached = proxy.stall_write(number, to=to)
        process = cli(["apply", "orders", "--jobs", jobs], proxy.env())
        wait_for(lambda: reached.is_set() or not process.is_alive(), f"apply's write {number} to {to}", timeout=240)
        assert reached.is_set(), f"apply ended ({process.exitcode}) before its write {number} to {to}"
        process.kill()
        process.join(60)
        proxy.calm()
        assert process.exitcode == -signal.SIGKILL

    def counted() -> tuple[int, list[tuple[int, int, str | None, str | None]]]:
        kept = records.read(job.store.storage, "orders")
        return kept.rescales_total, [(r.from_size, r.to_size, r.upgrade, r.outcome) for r in kept.rescales]

    with FaultyS3(s3_server.endpoint) as proxy:
        try:
            assert applied()["action"] == "DEPLOY"
            [old] = _live(job)
            assert _size(job, old) == 1
            dry = main(["apply", "orders", "--jobs", jobs, "--json", "--dry-run"])
            [step] = json.loads(capsys.readouterr().out)["jobs"]
            assert dry == 0 and step["action"] == "RESCALE" and "up from 1 to 2" in step["reason"], step

            # killed right after the rescale was recorded: nothing begun, nothing launched
            apply_killed_at(1, f"/{reconcile_key('orders')}")
            assert counted() == (1, [(1, 2, None, None)])
            assert upgrades.ids("orders") == [] and _live(job) == [old]

            # the next one goes on with it (not recorded again), killed right after it created the upgrade record
            apply_killed_at(1, "/upgrades/")
            [upgrade] = upgrades.list("orders")
            assert (upgrade.phase, upgrade.size, upgrade.from_size) == (Phase.SAVEPOINTING, 2, 1), upgrade
            assert counted() == (1, [(1, 2, None, None)]) and _live(job) == [old]

            # the next one takes the savepoint, runs the pre-flight, and is killed right after it launched the new
            # driver (its deployment record's second write: the launch), before the upgrade record names it
            apply_killed_at(2, "/deployment.json")
            upgrade = upgrades.get("orders", upgrade.id)
            [standby] = [d for d in job.deployments.list("orders") if d.id != old]
            assert (upgrade.phase, upgrade.new_deployment) == (Phase.LAUNCHING, None), upgrade
            assert standby.launcher and standby.prerestored_from is None and _size(job, standby.id) == 2

            # the next one is killed right after the cutover: the old driver stopped with a savepoint, the new one
            # started from it (the upgrade record's third write: the launch, the stop savepoint, CONFIRMING)
            apply_killed_at(3, "/upgrades/")
            upgrade = upgrades.get("orders", upgrade.id)
            assert upgrade.phase is Phase.CONFIRMING and upgrade.cutover_at and upgrade.new_deployment, upgrade
            new = _ends_at_one_driver_of_size_two(job, old)
            assert new == upgrade.new_deployment
            restored = job.deployments.get("orders", new).restored_batch_id
            assert restored is not None
            wait_for(lambda: _batch(job, new) >= restored + 3, "the new driver's batches past its restore")

            # the next one sees it healthy at once: killed right after the upgrade ended DONE, its outcome unrecorded
            apply_killed_at(1, "/upgrades/")
            assert upgrades.get("orders", upgrade.id).phase is Phase.DONE
            assert counted() == (1, [(1, 2, None, None)])

            # the next one records the outcome, once; then the cooldown keeps the new size
            finished = applied()
            assert finished["action"] == "RESCALE" and finished["ok"], finished
            assert counted() == (1, [(1, 2, upgrade.id, "DONE")])
            kept = applied()
            assert kept["action"] == "NOTHING" and "cooldown" in str(kept["reason"]), kept
            assert counted() == (1, [(1, 2, upgrade.id, "DONE")]) and upgrades.ids("orders") == [upgrade.id]
            assert _ends_at_one_driver_of_size_two(job, old) == new
            # the standby the killed apply launched mid-way through its pre-restore: ended, and never the job's state
            killed = job.deployments.get("orders", standby.id)
            assert [d.id for d in job.deployments.list("orders")] == [old, standby.id, new]
            assert killed.aborted_by == upgrade.id and process_seen(killed.launcher) is Liveness.GONE
        finally:
            kill_every_deployment(job)


ELSEWHERE = ["unshare", "-p", "-f", "--mount-proc"]  # another process table: the driver's pid means nothing there


@pytest.mark.slow(seconds=60)
def test_a_rescale_decided_in_another_pid_namespace_stops_the_old_driver_through_the_store(
    s3_store: str, tmp_path: Path
) -> None:
    if subprocess.run([*ELSEWHERE, "true"], check=False).returncode != 0:
        pytest.fail("`unshare -p -f --mount-proc` is refused here: the test needs root (as CI runs)")
    jobs, job = _declare(tmp_path, s3_store)
    out, code = tmp_path / "apply.json", tmp_path / "apply.code"
    elsewhere: subprocess.Popen[bytes] | None = None
    try:
        assert main(["apply", "orders", "--jobs", jobs]) == 0
        [old] = _live(job)
        # the other machine's apply launches the new driver in its namespace, which lives on with the namespace's init
        command = f"{sys.executable} -m airflow_plugin apply orders --jobs {jobs} --json >{out} 2>{out}.err"
        elsewhere = subprocess.Popen(
            [*ELSEWHERE, "bash", "-c", f"{command}; echo $? >{code}; exec sleep 600"], start_new_session=True
        )
        wait_for(lambda: code.exists() and code.read_text().strip() != "", "the other machine's apply", timeout=300)
        said = out.with_suffix(".json.err").read_text()
        assert code.read_text().strip() == "0", out.read_text() + said
        [row] = json.loads(out.read_text())["jobs"]
        assert row["action"] == "RESCALE" and row["ok"] and "from 1 to 2" in row["outcome"], row

        new = _ends_at_one_driver_of_size_two(job, old)
        launcher = job.deployments.get("orders", new).launcher
        assert process_seen(launcher) is Liveness.UNKNOWN, "the new driver runs in the other namespace"
        assert state_of(job, job.deployments.get("orders", new)) is State.RUNNING
        # the old driver stopped through its control channel, by its own word; only then was the new one admitted,
        # with no fence to wait out (a driver that said it stopped commits nothing more)
        stopped = job.deployments.status("orders", old)
        assert stopped is not None and stopped.state is State.STOPPED and stopped.handled_requests, stopped
        writers, _ = read_writers(job.store.storage, "orders")
        assert epoch_of(writers.changed_at) >= stopped.updated_at, (writers, stopped)
        assert "is fenced" not in said, said
        [upgrade] = Upgrades(job.store.storage).list("orders")
        assert upgrade.stop_savepoint is not None
        # the build that runs on this state, at another size: no Spark pre-flight, its writes as its runtime said
        assert upgrade.preflight is not None and upgrade.preflight["passed"], upgrade.preflight
        assert upgrade.preflight["reason"].startswith("a rescale of the build"), upgrade.preflight
        assert upgrade.preflight["log"] is None and upgrade.preflight["sink"] == stopped.sink, upgrade.preflight
        savepoint = job.store.get("orders", upgrade.stop_savepoint)
        assert savepoint.batch_id == stopped.last_batch_id, "the old driver committed nothing after its savepoint"
        assert job.deployments.get("orders", new).restored_batch_id == savepoint.batch_id
        [rescale] = records.read(job.store.storage, "orders").rescales
        assert (rescale.from_size, rescale.to_size, rescale.upgrade, rescale.outcome) == (1, 2, upgrade.id, "DONE")
    finally:
        if elsewhere is not None:
            os.killpg(elsewhere.pid, signal.SIGKILL)  # the namespace's init: everything in it ends with it
            elsewhere.wait()
        kill_every_deployment(job)


@pytest.mark.slow(seconds=40)
def test_a_rescale_after_the_code_file_was_edited_in_place_runs_the_whole_pre_flight(tmp_path: Path) -> None:
    """The same version, application path and arguments, other bytes (a `git pull` on the worker): the rescale's
    pre-flight runs the code on a copy of the state as any new code's does, where the running build's is skipped."""
    jobs, job = _declare(tmp_path, str(tmp_path / "store"))
    try:
        assert main(["apply", "orders", "--jobs", jobs]) == 0
        [old] = _live(job)
        launched = job.deployments.get("orders", old).code_digest
        app = Path(job.spec.version("v1").code)
        app.write_text(app.read_text() + "\n# edited in place\n")
        assert main(["apply", "orders", "--jobs", jobs]) == 0
        [upgrade] = Upgrades(job.store.storage).list("orders")
        assert upgrade.size == 2 and upgrade.preflight is not None, upgrade
        assert not upgrade.preflight["reason"].startswith("a rescale of the build"), upgrade.preflight
        assert upgrade.preflight["log"], "a Spark application of the version ran on a copy of the state"
        [new] = _live(job)
        assert launched is not None and job.deployments.get("orders", new).code_digest not in (None, launched)
    finally:
        kill_every_deployment(job)


@pytest.mark.slow(seconds=40)
def test_a_stop_restore_whose_new_driver_is_not_ready_in_time_aborts_before_the_old_one_is_stopped(
    tmp_path: Path,
) -> None:
    """The new driver still warming up (STARTING) when the upgrade's start timeout passes (a loaded YARN cluster):
    the upgrade aborts and stops it, and the old driver is never asked to stop: it commits on, the job's one writer.
    It once went on to the cutover, stopped the old driver, found the new one STARTING and rolled back."""
    jobs, job = _declare(tmp_path, str(tmp_path / "store"))
    try:
        assert main(["apply", "orders", "--jobs", jobs]) == 0
        [old] = _live(job)
        (tmp_path / "standby.hold").touch()  # BUSY_JOB's standby stays STARTING
        upgrade_cli = ["upgrade", "orders", "--version", "v1", "--mode", "stop_restore", "--start-timeout", "3"]
        assert main([*upgrade_cli, "--jobs", jobs]) == 11  # did not go through
        [upgrade] = Upgrades(job.store.storage).list("orders")
        assert upgrade.phase is Phase.ABORTED and upgrade.stop_savepoint is None, upgrade.history
        assert "did not reach STANDBY within 3 s" in str(upgrade.error), upgrade.error
        standby = job.deployments.get("orders", str(upgrade.new_deployment))
        assert standby.id != old and standby.aborted_by == upgrade.id and standby.retired_at
        assert state_of(job, standby) is State.STOPPED  # it answered the abort's stop
        status = job.deployments.status("orders", old)
        assert status is not None and status.handled_requests == [], "the old driver was never asked to stop"
        committed = _batch(job, old)
        wait_for(lambda: _batch(job, old) > committed, "the old driver to commit on", timeout=30)
        assert _live(job) == [old]
        assert read_writers(job.store.storage, "orders")[0].admits(old)
    finally:
        kill_every_deployment(job)


@pytest.mark.slow(seconds=40)
def test_an_abort_after_the_launch_step_was_killed_stops_the_driver_it_launched_unnamed(tmp_path: Path) -> None:
    """`savepoints upgrade` SIGKILLed while it waits for the new driver it launched and pre-restored (still warming
    up), before the upgrade record names it; then `upgrade --abort`: that driver is found by the step's request id,
    stopped and marked aborted, its location emptied; the old driver runs on, the job's one writer."""
    jobs, job = _declare(tmp_path, str(tmp_path / "store"))
    try:
        assert main(["apply", "orders", "--jobs", jobs]) == 0
        [old] = _live(job)
        (tmp_path / "standby.hold").touch()  # the new driver stays STARTING: the launch step waits on it

        def launched() -> list[Deployment]:
            return [d for d in job.deployments.list("orders") if d.id != old and d.prerestored_from]

        process = cli(["upgrade", "orders", "--version", "v1", "--mode", "stop_restore", "--jobs", jobs], {})
        wait_for(lambda: launched() or not process.is_alive(), "the new driver launched and pre-restored", timeout=240)
        process.kill()
        process.join(60)
        [upgrade] = Upgrades(job.store.storage).list("orders")
        [stray] = launched()
        assert (upgrade.phase, upgrade.new_deployment) == (Phase.LAUNCHING, None), upgrade
        assert state_of(job, stray).live and list(job.open(stray.checkpoint).list())

        assert main(["upgrade", "orders", "--abort", "--jobs", jobs]) == 11
        upgrade = Upgrades(job.store.storage).get("orders", upgrade.id)
        assert upgrade.phase is Phase.ABORTED, upgrade.history
        stray = job.deployments.get("orders", stray.id)
        assert stray.aborted_by == upgrade.id and not state_of(job, stray).live
        assert list(job.open(stray.checkpoint).list()) == [], "its pre-restore removed"
        assert _live(job) == [old] and read_writers(job.store.storage, "orders")[0].admits(old)
        status = job.deployments.status("orders", old)
        assert status is not None and status.handled_requests == [], "the old driver was never asked to stop"
    finally:
        kill_every_deployment(job)


@pytest.mark.slow(seconds=60)
def test_a_rescale_whose_old_driver_is_paused_at_the_cutover_aborts_and_the_driver_runs_on_when_it_wakes(
    tmp_path: Path,
) -> None:
    """The old driver SIGSTOPped right before the rescale's cutover (a long GC pause): its stop finds it LOST once its
    heartbeat is stale, and the rescale aborts, the new driver stopped, nothing restored. SIGCONT: the old driver
    wakes to no stop request (it was withdrawn), commits on, the job's one writer. It once woke to the stale request
    and stopped, with nobody to start it again."""
    jobs, job = _declare(tmp_path, str(tmp_path / "store"))
    try:
        assert main(["apply", "orders", "--jobs", jobs]) == 0
        [old] = _live(job)
        (tmp_path / "standby.hold").touch()  # the new driver waits STARTING until the old one is paused
        process = cli(["apply", "orders", "--jobs", jobs], {})
        wait_for(lambda: len(job.deployments.list("orders")) == 2 or not process.is_alive(), "the new driver's launch")
        group = job.deployments.get("orders", old).launcher["pid"]
        os.killpg(group, signal.SIGSTOP)
        try:
            (tmp_path / "standby.hold").unlink()
            process.join(240)
            [upgrade] = Upgrades(job.store.storage).list("orders")
            assert upgrade.phase is Phase.ABORTED and upgrade.stop_savepoint is None, upgrade.history
            assert "lost while stopping" in str(upgrade.error), upgrade.error
            new = job.deployments.get("orders", str(upgrade.new_deployment))
            assert new.aborted_by == upgrade.id and not state_of(job, new).live
        finally:
            os.killpg(group, signal.SIGCONT)
        committed = _batch(job, old)
        wait_for(lambda: _batch(job, old) > committed + 2, "the old driver to commit on after it woke", timeout=30)
        assert state_of(job, job.deployments.get("orders", old)) is State.RUNNING and _live(job) == [old]
        status = job.deployments.status("orders", old)
        assert status is not None and status.handled_requests == [], "no stop request was left for it"
        assert read_writers(job.store.storage, "orders")[0].admits(old)
    finally:
        kill_every_deployment(job)
