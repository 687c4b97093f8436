"""Declared jobs (issue 46): the jobs file's `desired` and `restart`, the pure plan of each job's step, and
`savepoints apply` carrying it out through real spark-submit processes (a stand-in driver that keeps a heartbeat,
writes a checkpoint and obeys a stop: no Spark session), killed with SIGKILL as a failing driver dies."""

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
from airflow_plugin.core.errors import InvalidInput, NoState
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.launcher import process_seen
from airflow_plugin.core.jobs.observe import state_of
from airflow_plugin.core.jobs.spec import Desired, RestartPolicy, load_jobs
from airflow_plugin.core.layout import reconcile_key
from airflow_plugin.core.lease import acquire
from airflow_plugin.core.process import Liveness
from airflow_plugin.core.reconcile import record as records
from airflow_plugin.core.reconcile.apply import apply_job, declared_status, describe_declared, next_step, retry
from airflow_plugin.core.reconcile.plan import (
    Action,
    Observed,
    Seen,
    UpgradeSeen,
    plan,
    restart_delay,
)
from airflow_plugin.core.reconcile.record import Reconciled, Restart
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import Kind, Manifest, SnapshotStatus, Trigger, new_snapshot_id
from airflow_plugin.core.records.writers import read_writers
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.timestamps import utc_now
from devtools.embedded_s3 import EmbeddedS3
from devtools.faulty_s3 import FaultyS3
from devtools.forked import cli
from devtools.windowed import wait_for
from tests.support.jobs import POLITE_JOB, kill_every_deployment, write_jobs
from tests.support.synthetic import write_checkpoint

NOW = 1_800_000_000.0
POLICY = RestartPolicy(attempts=3, window=3600, delay=10, max_delay=300)


def _seen(
    state: State, *, error: str | None = None, version: str = "v1", at: float = NOW - 1000, **more: object
) -> Seen:
    return Seen(id="dp-1", version=version, state=state, error_class=error, updated_at=at, last_batch_id=7, **more)  # type: ignore[arg-type]


def _observed(
    deployment: Seen | None,
    *,
    desired: Desired | None = None,
    record: Reconciled | None = None,
    upgrade: UpgradeSeen | None = None,
    fingerprint: str = "f1",
) -> Observed:
    return Observed(
        job="orders",
        desired=desired if desired is not None else Desired(version="v1"),
        restart=POLICY,
        fingerprint=fingerprint,
        now=NOW,
        deployment=deployment,
        upgrade=upgrade,
        record=record or Reconciled("orders"),
    )


# ---------------------------------------------------------------------------------------------------- the plan


def test_a_declared_job_is_deployed_kept_and_upgraded_to_its_desired_version() -> None:
    first = plan(_observed(None, desired=Desired(version="v1", restore="latest-savepoint")))
    assert (first.action, first.version, first.restore) == (Action.DEPLOY, "v1", "latest-savepoint")
    assert plan(_observed(_seen(State.STOPPED))).action is Action.DEPLOY, "desired running: a stopped job starts"
    kept = plan(_observed(_seen(State.RUNNING)))
    assert (kept.action, kept.version) == (Action.NOTHING, "v1")
    upgrade = plan(_observed(_seen(State.RUNNING), desired=Desired(version="v2", upgrade_mode="blue_green")))
    assert (upgrade.action, upgrade.version, upgrade.mode) == (Action.UPGRADE, "v2", "blue_green")
    assert plan(_observed(_seen(State.STARTING))).action is Action.WAIT
    assert plan(_observed(_seen(State.RUNNING), desired=None)).action is Action.NOTHING


def test_a_version_that_failed_is_held_until_the_declaration_changes() -> None:
    record = Reconciled("orders", failed_versions={"v3": "f1"}, last_stable_version="v2")
    held = plan(_observed(_seen(State.RUNNING, version="v2"), desired=Desired(version="v3"), record=record))
    assert held.action is Action.HOLD and "--retry" in held.reason
    changed = plan(
        _observed(_seen(State.RUNNING, version="v2"), desired=Desired(version="v3"), record=record, fingerprint="f2")
    )
    assert changed.action is Action.UPGRADE


@pytest.mark.parametrize(
    "error", ["SINK_AHEAD", "DELIVERY_GUARANTEE_NOT_MET", "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", "SCRIPT_NO_QUERY",
              "KILLED", "JOB_ARGUMENTS_REJECTED"],
)  # fmt: skip
def test_a_failure_no_restart_mends_is_held_for_a_person(error: str) -> None:
    step = plan(_observed(_seen(State.FAILED, error=error)))
    assert step.action is Action.HOLD and error in step.reason


def test_a_failed_or_lost_driver_is_restarted_after_its_delay_within_the_budget() -> None:
    waiting = plan(_observed(_seen(State.FAILED, error="STREAM_FAILED", at=NOW - 1)))
    assert waiting.action is Action.WAIT and waiting.not_before is not None and waiting.not_before > NOW
    restart = plan(_observed(_seen(State.FAILED, error="STREAM_FAILED")))
    assert (restart.action, restart.version, restart.restore) == (Action.RESTART, "v1", "latest-state")
    assert not restart.kill_first and restart.failed is not None and restart.failed.id == "dp-1"
    lost = plan(_observed(_seen(State.LOST)))
    assert lost.action is Action.RESTART and lost.kill_first, "a LOST driver that may still run is killed first"
    gone = plan(_observed(_seen(State.LOST, gone=True)))
    assert gone.action is Action.RESTART and not gone.kill_first

    spent = Reconciled("orders", restarts=[Restart(NOW - 600 * i, f"dp-{i}", "x", 1, "d") for i in range(2, 5)])
    assert plan(_observed(_seen(State.FAILED), record=spent)).action is Action.BUDGET_SPENT
    old = Reconciled("orders", restarts=[Restart(NOW - 4000 - i, f"dp-{i}", "x", 1, "d") for i in range(2, 9)])
    assert plan(_observed(_seen(State.FAILED), record=old)).action is Action.RESTART, "outside the window"
    spent.budget_from = NOW - 10  # `apply --retry`
    assert plan(_observed(_seen(State.FAILED), record=spent)).action is Action.RESTART

    ours = Reconciled("orders", restarts=[Restart(NOW - 1, "dp-1", "x", 1, None)])
    killed = plan(_observed(_seen(State.FAILED, error="KILLED", at=NOW - 1), record=ours))
    assert killed.action is Action.RESTART, "the loop killed it to restart it: the restart goes on, at once"


def test_after_a_stop_the_job_continues_from_its_latest_state_not_from_the_first_starts_restore() -> None:
    """Issue 51 (4): `desired.restore` is a first start's; after a person's stop without a savepoint, an older
    savepoint would give a Kafka sink its output again and be refused by a file sink on every run."""
    desired = Desired(version="v1", restore="latest-savepoint")
    first = plan(_observed(None, desired=desired))
    assert (first.action, first.restore) == (Action.DEPLOY, "latest-savepoint")
    again = plan(_observed(_seen(State.STOPPED), desired=desired))
    assert (again.action, again.version, again.restore) == (Action.DEPLOY, "v1", "latest-state")
    assert "latest-savepoint" in again.reason and "first start" in again.reason, again.reason


def test_a_restart_whose_deploy_failed_counts_against_the_budget_and_waits_its_delay() -> None:
    """Issue 51 (6): a restart refused at deploy time (no state, a source gap) leaves the failed deployment the
    newest; the next look waits its delay, the budget counts it, and the same refusal again is held."""
    refused = "NoState: job orders has 1 earlier deployment(s) but no state to take over"

    def tried(*ats: float, error: str | None = refused, budget_from: float | None = None) -> Reconciled:
        attempts = [Restart(at, "dp-1", "x", 7, None, error=error) for at in ats]
        return Reconciled("orders", restarts=attempts, budget_from=budget_from)

    waiting = plan(_observed(_seen(State.FAILED, error="STREAM_FAILED"), record=tried(NOW - 1)))
    assert waiting.action is Action.WAIT and waiting.not_before is not None, waiting
    assert NOW + 10 <= waiting.not_before <= NOW + 30, "the second restart's delay, from the first one's attempt"
    due = plan(_observed(_seen(State.FAILED, error="STREAM_FAILED"), record=tried(NOW - 60)))
    assert due.action is Action.RESTART and "restart 2 of 3" in due.reason, due.reason

    earlier = Restart(NOW - 500, "dp-0", "x", 7, "dp-1")  # another failure's restart, in the window
    other = Reconciled("orders", restarts=[earlier, *tried(NOW - 400, NOW - 300).restarts])
    spent = plan(_observed(_seen(State.FAILED, error="STREAM_FAILED"), record=other))
    assert spent.action is Action.BUDGET_SPENT and refused in spent.reason, spent.reason
    repeated = plan(_observed(_seen(State.FAILED), record=tried(NOW - 400, NOW - 200, NOW - 100)))
    assert repeated.action in (Action.HOLD, Action.BUDGET_SPENT) and refused in repeated.reason, repeated.reason

    killed = plan(_observed(_seen(State.FAILED, error="KILLED"), record=tried(NOW - 100)))
    assert killed.action is Action.RESTART, "its KILLED is the loop's own kill before a deploy that failed"
    pending = plan(_observed(_seen(State.FAILED), record=tried(NOW - 1, error=None)))
    assert pending.action is Action.RESTART, "killed between recording the restart and its deploy: goes on at once"
    retried = plan(_observed(_seen(State.FAILED), record=tried(NOW - 400, NOW - 200, NOW - 100, budget_from=NOW - 50)))
    assert retried.action is Action.RESTART, "`apply --retry`: the budget and the refusals count from then"


def test_the_restart_delay_doubles_up_to_its_cap_with_the_same_jitter_for_one_failure() -> None:
    first, again = restart_delay(POLICY, 0, "dp-a"), restart_delay(POLICY, 0, "dp-a")
    assert first == again and 8 <= first <= 12
    assert 16 <= restart_delay(POLICY, 1, "dp-a") <= 24
    assert restart_delay(POLICY, 10, "dp-a") == pytest.approx(300, rel=0.2) and restart_delay(POLICY, 10, "x") <= 300
    assert len({restart_delay(POLICY, 0, f"dp-{i}") for i in range(20)}) > 10, "jitter spreads restarts"


def test_pause_upgrades_and_a_desired_stop() -> None:
    paused = Reconciled("orders", paused_by="ann", paused_at="now")
    assert plan(_observed(_seen(State.FAILED), record=paused)).action is Action.PAUSED
    own = UpgradeSeen("up-1", "CATCHING_UP", "v2", by_loop=True)
    assert plan(_observed(_seen(State.RUNNING), upgrade=own)).action is Action.RESUME_UPGRADE
    theirs = UpgradeSeen("up-1", "CATCHING_UP", "v2", by_loop=False)
    assert plan(_observed(_seen(State.RUNNING), upgrade=theirs)).action is Action.WAIT
    stopped = Desired(state="stopped", version="v1")
    assert plan(_observed(_seen(State.RUNNING), desired=stopped)).action is Action.STOP
    assert plan(_observed(_seen(State.STOPPED), desired=stopped)).action is Action.NOTHING
    assert plan(_observed(_seen(State.FAILED), desired=stopped)).action is Action.NOTHING


# ---------------------------------------------------------------------------------------------- the jobs file


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('desired = { state = "up" }', 'desired.state = \'up\': use "running" or "stopped"'),
        ('desired = { version = "v9" }', "desired.version = 'v9' is not a declared version: declared are v1, v2"),
        ('desired = { upgrade_mode = "fast" }', "desired.upgrade_mode = 'fast': use one of auto, blue_green"),
        ('desired = { verison = "v2" }', "desired has unknown key(s) verison"),
        ("restart = { attempts = -1 }", "restart.attempts = -1: give a whole number"),
        ('restart = { delay = "10 minutes", max_delay = "1 minute" }', "restart.max_delay is shorter"),
        ('restart = { window = "soon" }', "restart.window"),
    ],
)
def test_a_bad_desired_or_restart_table_is_refused_naming_the_key(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_jobs(str(write_jobs(tmp_path, extra=extra)))


def test_the_declaration_defaults_and_its_fingerprint(tmp_path: Path) -> None:
    jobs = load_jobs(str(write_jobs(tmp_path, extra='desired = { version = "v2" }')))["orders"]
    assert jobs.desired == Desired(state="running", version="v2", upgrade_mode="auto", restore="latest-state")
    assert jobs.restart == RestartPolicy()
    again = load_jobs(str(write_jobs(tmp_path, extra='desired = { version = "v2" }')))["orders"]
    other = load_jobs(str(write_jobs(tmp_path, extra='desired = { version = "v1" }')))["orders"]
    assert jobs.fingerprint == again.fingerprint != other.fingerprint
    assert load_jobs(str(write_jobs(tmp_path)))["orders"].desired is None


# ------------------------------------------------------------------------------- apply, a store, no driver


def test_a_job_stopped_without_a_savepoint_is_deployed_from_its_state_not_an_older_savepoint(tmp_path: Path) -> None:
    """Issue 51 (4), observed from a store: `restore = "latest-savepoint"` declared, an older savepoint (batch 4),
    and a person's `savepoints stop` without one (the stopped deployment's checkpoint is at batch 19): the next
    apply deploys from the latest state, which the deploy finds in that checkpoint, not from the savepoint."""
    declared = 'desired = { version = "v1", restore = "latest-savepoint" }'
    job = Settings(jobs_file=str(write_jobs(tmp_path, extra=declared))).resolve().job("orders")
    older = write_checkpoint(tmp_path / "older", batches=5)
    create_snapshot(job.store, open_storage(str(older)), SnapshotRequest(job="orders", job_version="v1"))
    assert next_step(job).restore == "latest-savepoint", "a first start: nothing ran yet"
    deployments = Deployments(job.store.storage)
    stopped = Deployment("dp-20260101T000000000Z-0001", "orders", "v1", str(write_checkpoint(tmp_path / "c", 20)))
    deployments.put(stopped)
    deployments.write_status("orders", stopped.id, DeploymentStatus(State.STOPPED, time.time(), last_batch_id=19))
    step = next_step(job)
    assert (step.action, step.version, step.restore) == (Action.DEPLOY, "v1", "latest-state"), step
    assert "latest-savepoint is a first start's only" in step.reason, step.reason
    assert apply_job(job, dry_run=True).step == step


# --------------------------------------------------------------------------------- apply, a real refusal


def test_a_restart_refused_at_deploy_counts_against_the_budget_waits_and_is_held(tmp_path: Path) -> None:
    """Issue 51 (6), through `apply_job` and a real deploy: the failed deployment left no state to take over (no
    committed batch, and only a FAILED snapshot: it had state once), so its restart's deploy is refused (NoState)
    and it stays the newest. Each
    refused restart is an attempt: recorded with its error, counted by the budget, followed by its delay; the same
    refusal 3 times is held for a person, and a spent budget names it. No driver is launched."""
    restart = 'restart = {{ attempts = {attempts}, delay = "{delay}", max_delay = "1 minute" }}'

    def declare(attempts: int, delay: str) -> JobContext:
        extra = f'desired = {{ version = "v1" }}\n{restart.format(attempts=attempts, delay=delay)}'
        return Settings(jobs_file=str(write_jobs(tmp_path, extra=extra))).resolve().job("orders")

    job = declare(5, "10s")
    deployments = Deployments(job.store.storage)
    failed = Deployment("dp-20260101T000000000Z-0001", "orders", "v1", str(tmp_path / "checkpoints/none-committed"))
    deployments.put(failed)
    crashed = DeploymentStatus(State.FAILED, time.time() - 60, error_class="STREAM_FAILED", error_message="boom")
    deployments.write_status("orders", failed.id, crashed)
    tried = Manifest(
        new_snapshot_id(Kind.SAVEPOINT), "orders", Kind.SAVEPOINT, Trigger.MANUAL, SnapshotStatus.FAILED, "x", utc_now()
    )
    job.store.add(tried)  # a snapshot of it failed: there was state, which nothing can take over now

    def attempts() -> list[Restart]:
        return records.read(job.store.storage, "orders").restarts

    refused = apply_job(job)
    assert refused.step.action is Action.RESTART and isinstance(refused.error, NoState), refused
    [attempt] = attempts()
    assert (attempt.failed, attempt.deployment) == (failed.id, None) and (attempt.error or "").startswith("NoState: ")
    waiting = apply_job(job)
    assert waiting.step.action is Action.WAIT and waiting.ok, "the next restart waits its delay, from the refusal"
    assert waiting.step.not_before is not None and waiting.step.not_before >= attempt.at + 16
    assert "NoState" in waiting.step.reason and len(attempts()) == 1

    job = declare(5, "0s")
    for _ in range(2):
        again = apply_job(job)
        assert again.step.action is Action.RESTART and isinstance(again.error, NoState), again
    held = apply_job(job)
    assert held.step.action is Action.HOLD and "refused 3 times: NoState" in held.step.reason, held.step.reason
    assert [r.error == attempt.error for r in attempts()] == [True] * 3, "one attempt each, the same refusal"
    assert [d.id for d in deployments.list("orders")] == [failed.id], "nothing launched"
    status = declared_status(job)
    assert status is not None and (status["restarts"], status["restarts_failed"], status["restarts_left"]) == (3, 3, 2)
    assert "3 restart(s) (3 failed), 2 left in the window" in describe_declared("orders", status)

    job = declare(3, "0s")
    spent = apply_job(job)
    assert spent.step.action is Action.BUDGET_SPENT and "NoState" in spent.step.reason, spent.step.reason
    assert declared_status(job)["restarts_left"] == 0  # type: ignore[index]
    retry(job)  # `apply --retry`: the budget and the refusals count from now
    assert apply_job(job).step.action is Action.RESTART and len(attempts()) == 4


# ---------------------------------------------------------------------------------- apply, real processes


@pytest.mark.slow
def test_apply_starts_a_declared_job_restarts_it_after_a_kill_and_stops_within_its_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = tmp_path / "polite.py"
    app.write_text(POLITE_JOB)
    declared = 'desired = { version = "v1" }\nrestart = { attempts = 1, delay = "0s", max_delay = "1s" }'
    jobs = str(write_jobs(tmp_path, application=str(app), extra=declared))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    records_ = Deployments(job.store.storage)

    def newest() -> str:
        return records_.list("orders")[-1].id

    def sigkill(deployment_id: str) -> None:
        launcher = records_.get("orders", deployment_id).launcher
        os.killpg(launcher["pid"], signal.SIGKILL)
        wait_for(lambda: process_seen(launcher) is not Liveness.ALIVE, "the driver to die")

    def applied(*argv: str) -> dict[str, object]:
        assert main(["apply", *argv, "--jobs", jobs, "--json"]) == 0
        [row] = json.loads(capsys.readouterr().out)["jobs"]
        return row

    try:
        assert applied("--dry-run")["action"] == "DEPLOY" and not records_.list("orders"), "a dry run changes nothing"
        assert applied()["action"] == "DEPLOY"
        first = newest()
        assert state_of(job, records_.get("orders", first)) is State.RUNNING
        kept = applied()
        assert kept["action"] == "NOTHING" and records.read(job.store.storage, "orders").last_stable_version == "v1"

        sigkill(first)
        restarted = applied()
        assert restarted["action"] == "RESTART" and restarted["ok"], restarted
        second = newest()
        assert second != first and state_of(job, records_.get("orders", second)) is State.RUNNING
        assert records_.get("orders", second).restored_batch_id == 19, "from its latest state"
        [restart] = records.read(job.store.storage, "orders").restarts
        assert (restart.failed, restart.deployment, restart.from_batch) == (first, second, 19)
        assert main(["status", "orders", "--jobs", jobs]) == 0
        said = capsys.readouterr().out
        assert "declared: orders: desired v1 running; last stable v1; 1 restart(s), 0 left in the window" in said, said

        # a person's operation holds the job: apply is refused by the lease, and starts nothing
        sigkill(second)
        with acquire(job.store.storage, "orders", "ann@desk:1", "stop"):
            refused = applied()
            assert refused["action"] == "BUDGET_SPENT", "one restart in the window: the budget is spent"
        assert newest() == second and state_of(job, records_.get("orders", second)) is State.LOST
        with acquire(job.store.storage, "orders", "ann@desk:1", "stop"):
            assert main(["apply", "orders", "--retry", "--jobs", jobs]) == 4, "refused: a person holds the job"
            assert "ann@desk:1" in capsys.readouterr().err
        assert newest() == second
        # issue 53 (2): --retry releases the budget and restarts in the same run, saying so
        assert main(["apply", "orders", "--retry", "--jobs", jobs]) == 0
        said = capsys.readouterr().out
        assert "orders: retried" in said and "orders: RESTART" in said, said
        third = newest()
        assert third != second and state_of(job, records_.get("orders", third)) is State.RUNNING

        # paused: the loop leaves it alone; a failure no restart mends is held
        assert main(["apply", "orders", "--pause", "--jobs", jobs]) == 0
        capsys.readouterr()
        sigkill(third)
        assert applied()["action"] == "PAUSED" and newest() == third
        assert main(["apply", "orders", "--resume", "--jobs", jobs]) == 0
        capsys.readouterr()
        refusal = DeploymentStatus(State.FAILED, 0.0, error_class="SINK_AHEAD", error_message="the sink holds batch 21")
        records_.write_status("orders", third, refusal)
        assert applied()["action"] == "HOLD" and newest() == third

        # desired stopped: stopped with a savepoint
        Path(jobs).write_text(Path(jobs).read_text().replace('desired = { version = "v1" }', "desired = {}"))
        assert main(["apply", "orders", "--retry", "--jobs", jobs]) == 0
        capsys.readouterr()
        records_.write_status("orders", third, DeploymentStatus(State.FAILED, 0.0, error_class="STREAM_FAILED"))
        assert applied()["action"] == "RESTART"
        fourth = newest()
        Path(jobs).write_text(Path(jobs).read_text().replace("desired = {}", 'desired = { state = "stopped" }'))
        assert applied()["action"] == "STOP"
        assert state_of(job, records_.get("orders", fourth)) is State.STOPPED
        [savepoint] = [m for m in SnapshotStore(job.store.storage).list("orders") if m.kind is Kind.SAVEPOINT]
        assert savepoint.deployment == fourth
        assert applied()["action"] == "NOTHING"
    finally:
        kill_every_deployment(job)


@pytest.mark.slow
def test_two_apply_processes_at_once_start_one_driver(tmp_path: Path) -> None:
    """Issue 51: two `savepoints apply` runs at once (two Airflow workers, the DAG's schedule and its file watcher)
    on a job that nothing runs: one deploys, the other is refused by the job's lease or finds the deployment; one
    driver, one writer in the job's writers record."""
    app = tmp_path / "polite.py"
    app.write_text(POLITE_JOB)
    jobs = str(write_jobs(tmp_path, application=str(app), extra='desired = { version = "v1" }'))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    command = [sys.executable, "-m", "airflow_plugin", "apply", "orders", "--jobs", jobs, "--json"]
    try:
        runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
        done = [run.communicate(timeout=240) for run in runs]
        codes = sorted(run.returncode for run in runs)
        assert codes in ([0, 0], [0, 4]), done  # 4: the lease held by the other, nothing done
        listed = Deployments(job.store.storage).list("orders")
        assert len(listed) == 1, [d.id for d in listed]
        writers, _ = read_writers(job.store.storage, "orders")
        assert list(writers.writers) == [listed[0].id] and writers.generation == 1, writers
    finally:
        kill_every_deployment(job)


@pytest.mark.slow
def test_apply_killed_on_either_side_of_a_restarts_deploy_leaves_one_driver_and_counts_it_once(
    s3_server: EmbeddedS3, s3_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`apply` SIGKILLed right after it recorded a restart, before it deployed: its next run (which takes over the
    dead process's lease at once) restarts the job, and the restart is counted once. Killed right after the
    deploy, before it recorded it: the new driver runs on, and the next run leaves it alone. Every kill lands
    right after a write to the job's reconcile record took effect (the fault proxy holds back its answer)."""
    app = tmp_path / "polite.py"
    app.write_text(POLITE_JOB)
    declared = 'desired = { version = "v1" }\nrestart = { attempts = 3, delay = "0s", max_delay = "1s" }'
    jobs = str(write_jobs(tmp_path, application=str(app), extra=f'{declared}\nstore = "{s3_store}"'))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    records_ = Deployments(job.store.storage)

    def newest() -> str:
        return records_.list("orders")[-1].id

    def live() -> list[str]:
        return [d.id for d in records_.list("orders") if state_of(job, d).live]

    def sigkill_driver(deployment_id: str) -> None:
        launcher = records_.get("orders", deployment_id).launcher
        os.killpg(launcher["pid"], signal.SIGKILL)
        wait_for(lambda: process_seen(launcher) is not Liveness.ALIVE, "the driver to die")

    def apply_killed_at_record_write(number: int) -> None:
        reached = proxy.stall_write(number, to=f"/{reconcile_key('orders')}")
        process = cli(["apply", "orders", "--jobs", jobs], proxy.env())
        wait_for(lambda: reached.is_set() or not process.is_alive(), f"apply's write {number} of the record")
        assert reached.is_set(), f"apply ended ({process.exitcode}) before its write {number} of the record"
        process.kill()
        process.join(60)
        proxy.calm()
        assert process.exitcode == -signal.SIGKILL

    def applied() -> dict[str, object]:
        assert main(["apply", "orders", "--jobs", jobs, "--json"]) == 0
        [row] = json.loads(capsys.readouterr().out)["jobs"]
        return row

    with FaultyS3(s3_server.endpoint) as proxy:
        try:
            assert applied()["action"] == "DEPLOY"
            first = newest()

            # killed after the restart is recorded, before the deploy: nothing launched; the next run restarts
            sigkill_driver(first)
            apply_killed_at_record_write(1)
            [pending] = records.read(job.store.storage, "orders").restarts
            assert (pending.failed, pending.deployment) == (first, None) and newest() == first and live() == []
            restarted = applied()
            assert restarted["action"] == "RESTART" and restarted["ok"], restarted
            second = newest()
            assert second != first and live() == [second]
            [restart] = records.read(job.store.storage, "orders").restarts
            assert (restart.failed, restart.deployment, restart.from_batch) == (first, second, 19), "counted once"

            # killed after the deploy, before it is recorded: the new driver runs on, alone, and is left alone
            sigkill_driver(second)
            apply_killed_at_record_write(2)
            third = newest()
            assert third != second
            wait_for(lambda: live() == [third], "the restarted driver to run, alone")
            assert [r.failed for r in records.read(job.store.storage, "orders").restarts] == [first, second]
            assert applied()["action"] == "NOTHING" and newest() == third and live() == [third]
            assert records_.get("orders", third).restored_batch_id == 19, "from its latest state"
        finally:
            kill_every_deployment(job)
