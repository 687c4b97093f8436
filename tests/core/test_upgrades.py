"""Upgrades as records and steps (core/upgrades), without Spark: which mode applies and why, the record's round
trip, the gate's decisions in the driver (spark_jobs/runtime/gate.py, its pure part), and what `begin`,
`cancel` and `outcome` do around a running upgrade. The real thing, with drivers, a broker and a Delta table:
tests/e2e/test_blue_green.py and tests/e2e/test_dags_e2e.py."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.errors import InvalidInput, Refused, UpgradeFailed
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.lease import acquire, airflow_holder, default_holder, read_lease
from airflow_plugin.core.process import ProcessId
from airflow_plugin.core.reconcile.apply import apply_job, loop_context, next_step
from airflow_plugin.core.reconcile.plan import Action
from airflow_plugin.core.records.deployment import ControlRequest, Deployment, DeploymentStatus, State
from airflow_plugin.core.upgrades.mode import Observed, decide, parse_size, room_for_two
from airflow_plugin.core.upgrades.record import Mode, Phase, Upgrade, UpgradeMovedOn, Upgrades, new_upgrade_id
from airflow_plugin.core.upgrades.run import approve, begin, cancel, outcome
from airflow_plugin.core.upgrades.steps import UpgradeSettings, upgrade_holder
from spark_jobs.runtime.gate import BLUE, GREEN, LOST_RACE, SOLE, STAGING, DeltaTarget, GatedWriter, GateState
from tests.support.jobs import write_jobs

TABLE = "DeltaSink[s3a://lake/output]"
# the pre-flight found the table's S3 honouring conditional writes: the drivers' commit lock can be made of them
GATE = {"column": "window_end", "role": "sole", "conditional_writes": True}
# what the runtime reads from the example job's plan (spark_jobs/runtime/shape.py)
WINDOWS = {
    "watermarks": [{"column": "event_time", "delay_ms": 60_000}],
    "stateful": ["deduplication", "time window aggregation"],
    "gate_is_window_end": True,
}


def seen(**changes: Any) -> Observed:
    base: dict[str, Any] = {
        "old_sink": TABLE,
        "old_gate": GATE,
        "new_sink": TABLE,
        "new_gate": GATE,
        "master": "local[2]",
        "driver_memory": "1g",
        "available_memory": 8 << 30,
        "old_shape": WINDOWS,
        "new_shape": WINDOWS,
    }
    return Observed(**{**base, **changes})


def test_blue_green_applies_where_both_versions_write_one_table_through_one_gate() -> None:
    chosen = decide(None, seen())
    assert chosen.mode is Mode.BLUE_GREEN and chosen.blocked is None
    assert "no gap" in chosen.reasons[Mode.BLUE_GREEN] and "always possible" in chosen.reasons[Mode.STOP_RESTORE]
    assert decide("stop_restore", seen()).mode is Mode.STOP_RESTORE  # asked for: taken


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"new_gate": {"not_gated": "its sink is FileSink[/out], not a Delta table"}}, "its sink is FileSink[/out]"),
        ({"old_gate": None}, "does not write through the gate"),
        ({"old_gate": {**GATE, "role": "blue"}}, "is blue in another upgrade"),
        ({"new_gate": {**GATE, "column": "window_start"}}, "different columns (window_end and window_start)"),
        ({"new_sink": "DeltaSink[s3a://lake/other]"}, "write different tables"),
        ({"available_memory": 1 << 30, "driver_memory": "2g"}, "needs about 3072 MiB"),
        (
            {"new_shape": {**WINDOWS, "stateful": ["session window aggregation"]}},
            "the new version holds a session window (a record one version drops as late and the other accepts",
        ),
        (
            {"old_shape": {**WINDOWS, "stateful": []}},
            "the running version has no windowed state: its rows are written as they arrive",
        ),
        ({"new_shape": {**WINDOWS, "watermarks": []}}, "the new version has 0 event-time watermarks"),
        ({"new_shape": {**WINDOWS, "stateful": ["stream-stream join"]}}, "holds a stream-stream join"),
        ({"new_shape": {**WINDOWS, "gate_is_window_end": False}}, "gate column window_end is not the end of its"),
        ({"old_shape": None}, "the running version's plan is not known"),
        ({"new_shape": {"unknown": "its plan could not be read (Py4JError)"}}, "could not be read (Py4JError)"),
    ],
)
def test_blue_green_falls_back_to_stop_restore_with_the_reason(changes: dict[str, Any], why: str) -> None:
    chosen = decide(None, seen(**changes))
    assert chosen.mode is Mode.STOP_RESTORE and why in chosen.reasons[Mode.BLUE_GREEN]
    asked = decide("blue_green", seen(**changes))
    assert asked.mode is None and asked.blocked is not None and why in asked.blocked


UNTRIED = {"column": "window_end", "role": "sole"}  # what a pre-flight that tried nothing reports
IGNORED = "s3://lake/output took a create of a key that exists (If-None-Match) as if it were unconditional"


@pytest.mark.parametrize(
    ("sink", "gate", "why"),
    [
        (TABLE, UNTRIED, "the pre-flight did not try them"),
        (TABLE, {**UNTRIED, "conditional_writes": IGNORED}, IGNORED),
        ("DeltaSink[s3://lake/output]", {**UNTRIED, "conditional_writes": "trying them failed (AccessDenied)"}, ""),
        ("DeltaSink[gs://lake/output]", GATE, "there is no commit lock for a gs:// table"),
    ],
)
def test_two_versions_at_once_are_refused_where_their_drivers_cannot_take_turns_at_the_table(
    sink: str, gate: dict[str, Any], why: str
) -> None:
    """Delta's default LogStore on S3 lets two JVMs write one log version (a commit lost): blue/green, replay and
    migrate need the runtime's commit lock, made of the table's conditional writes; where the pre-flight did not
    find them honoured, `auto` takes stop_restore, and an asked-for mode that runs both versions is blocked."""
    changes = {"old_sink": sink, "new_sink": sink, "new_gate": gate}
    chosen = decide(None, seen(**changes))
    reason = chosen.reasons[Mode.BLUE_GREEN]
    assert chosen.mode is Mode.STOP_RESTORE and why in reason and "cannot take turns at committing to" in reason
    for mode in ("blue_green", "replay"):
        asked = decide(mode, seen(replay_reason="replays 5 records", **changes))
        assert asked.mode is None and "cannot take turns at committing" in str(asked.blocked), mode
    rebuilt = decide(None, seen(state_problem="renamed", migrate="jobs.m:f", kafka_only=True, **changes))
    assert rebuilt.mode is None and "cannot take turns at committing" in str(rebuilt.blocked)


@pytest.mark.parametrize("table", ["/lake/output", "file:/lake/output", "hdfs://nn:8020/lake/output"])
def test_local_and_hdfs_tables_need_no_lock_object(table: str) -> None:
    """A local table's drivers take turns through a file lock (one host), HDFS renames atomically."""
    sink = f"DeltaSink[{table}]"
    assert decide(None, seen(old_sink=sink, new_sink=sink, new_gate=UNTRIED)).mode is Mode.BLUE_GREEN


def test_a_second_driver_is_checked_against_free_memory_only_on_a_local_master() -> None:
    assert parse_size("512m") == 512 << 20 and parse_size(None) == 1 << 30 and parse_size("2g") == 2 << 30
    assert room_for_two(seen(available_memory=1 << 30)) is not None  # 1g heap and its overhead: more than 1 GiB
    assert room_for_two(seen(available_memory=1 << 30, master="yarn")) is None  # the cluster manager decides
    assert room_for_two(seen(available_memory=None)) is None  # unknown: not refused


def test_the_record_round_trips_and_knows_its_cutover() -> None:
    upgrade = Upgrade(id="up-1", job="orders", to_version="v2", mode="blue_green")
    upgrade.move(Phase.CUTTING_OVER, "green healthy")
    again = Upgrade.from_json(upgrade.to_json(), "here")
    assert again == upgrade and again.phase is Phase.CUTTING_OVER and not again.cut_over
    again.cutover_at = "2026-11-24T00:00:00Z"
    assert again.cut_over
    stop_restore = Upgrade(id="up-2", job="orders", to_version="v2", mode="stop_restore", stop_savepoint="sp-1")
    assert stop_restore.cut_over  # the old version stopped: only a rollback puts it back


class Driver:
    """The gate's decisions as the runtime takes them between two batches (`handle`) and at the next batch (a
    publish), with what it reports and answers, and an upgrade that wants its requests until told otherwise."""

    def __init__(self, gate: GateState) -> None:
        self.answers: dict[str, str] = {}
        self.reported: list[dict[str, Any]] = []
        self.unwanted: dict[str, str] = {}  # upgrade -> why it no longer wants its requests
        self.writer = GatedWriter(
            None,  # type: ignore[arg-type]  # deciding needs no Spark
            DeltaTarget("s3a://lake/output"),
            gate,
            "/ck",
            lambda state: self.reported.append(state.to_dict()),
            lambda request, answer: self.answers.__setitem__(request.id, answer),
            lambda upgrade: self.unwanted.get(str(upgrade)),
        )

    def send(self, action: str, upgrade: str = "up-1", expires_in: float | None = None, **values: int) -> str | None:
        """Hand a request over; its answer, or None while it waits for a batch (a publish)."""
        request_id = f"rq-{action}-{upgrade}"
        self.answers.pop(request_id, None)
        expires = None if expires_in is None else time.time() + expires_in
        request = ControlRequest(request_id, action, gate=values, upgrade=upgrade, expires_at=expires)
        self.writer.handle(request)
        return self.answers.get(request_id)

    def batch(self) -> int | None:
        """What the next batch publishes (T), deciding a waiting publish as the batch would."""
        taken = self.writer._take_publish()
        return None if taken is None else int((taken.gate or {})["t"])


def test_the_old_version_picks_t_from_what_it_wrote_and_gives_the_rest_up() -> None:
    blue = Driver(GateState("window_end", max_written=1_000_000))
    assert blue.send("gate", margin=60_000) == "accepted"
    gate = blue.writer.gate
    assert (gate.role, gate.until, gate.upgrade) == (BLUE, 1_060_000, "up-1")
    assert blue.reported[-1]["until"] == 1_060_000, "the status holds T before the answer"
    assert blue.send("gate", margin=0) == "accepted" and gate.until == 1_060_000, "seen again: the same T"
    assert blue.send("ungate") == "accepted", "nothing left to the new version yet: it can go on alone"
    assert (gate.role, gate.until, gate.upgrade) == (SOLE, None, None)
    assert blue.send("ungate") == "accepted", "idempotent"
    assert blue.send("gate").startswith("declined: upgrade up-1 took its requests back")  # type: ignore[union-attr]
    assert gate.role == SOLE

    blue.send("gate", upgrade="up-2")
    gate.dropped = 12  # a batch left rows ending after T to the new version
    assert blue.send("ungate", upgrade="up-2").startswith("declined: it already left 12 rows")  # type: ignore[union-attr]
    assert gate.role == BLUE
    assert blue.send("gate", upgrade="up-3").startswith("declined: it is gated by upgrade up-2")  # type: ignore[union-attr]

    fresh = Driver(GateState("window_end"))  # wrote nothing yet: T is the margin past nothing
    fresh.send("gate")
    assert fresh.writer.gate.until == 0


def test_a_gate_request_is_applied_only_while_its_upgrade_wants_it_and_never_after_its_withdrawal() -> None:
    """The abort's `ungate` may reach the old version before the gate it withdraws (the upgrade was killed right
    after sending the gate, then aborted): whatever the order, the gate is never applied. A gate request that
    expired, or whose upgrade no longer cuts over, is declined."""
    blue = Driver(GateState("window_end", max_written=1_000))
    assert blue.send("ungate") == "accepted" and blue.writer.gate.withdrawn == ["up-1"]
    assert "took its requests back" in str(blue.send("gate"))
    assert blue.writer.gate.role == SOLE

    late = Driver(GateState("window_end"))
    assert "expired at" in str(late.send("gate", expires_in=-1.0)) and late.writer.gate.role == SOLE
    late.unwanted["up-1"] = "upgrade up-1 is ABORTING, no longer cutting over"
    assert late.send("gate", expires_in=60.0) == "declined: upgrade up-1 is ABORTING, no longer cutting over"
    assert late.writer.gate.role == SOLE and late.writer.gate.until is None


def test_the_new_version_publishes_at_its_next_batch_unless_withdrawn() -> None:
    green = Driver(GateState("window_end", role=STAGING, staging="/staging"))
    assert green.send("publish", t=5_000) is None, "answered once its commit is in, at the next batch"
    assert str(green.send("gate")).startswith("declined: it is staging")
    assert green.batch() == 5_000

    fenced = Driver(GateState("window_end", role=STAGING, staging="/staging"))
    fenced.send("publish", t=5_000)
    assert fenced.send("withdraw") == "accepted", "withdrawn before any batch took it"
    assert fenced.answers["rq-publish-up-1"] == "declined: withdrawn by its upgrade"
    assert fenced.batch() is None and fenced.writer.gate.role == STAGING
    assert "took its requests back" in str(fenced.send("publish", t=5_000)), "a publish seen later is refused too"

    unwanted = Driver(GateState("window_end", role=STAGING, staging="/staging"))
    unwanted.send("publish", t=5_000)
    unwanted.unwanted["up-1"] = "upgrade up-1 is ABORTED, no longer cutting over"  # the driver was paused meanwhile
    assert unwanted.batch() is None
    assert unwanted.answers["rq-publish-up-1"] == "declined: upgrade up-1 is ABORTED, no longer cutting over"

    published = Driver(GateState("window_end", role=GREEN, after=5_000, upgrade="up-1", published_batch=9))
    assert published.send("publish", t=5_000) == "accepted", "seen again by a later attempt: it published"
    assert str(published.send("withdraw")).startswith("declined: it published at batch 9")
    assert str(published.send("publish", t=6_000, upgrade="up-2")) == "declined: it is green, not staging"


def test_the_gate_a_status_recorded_is_read_back_whole() -> None:
    gate = GateState("window_end", BLUE, until=7, dropped=3, upgrade="up-1", withdrawn=["up-0"])
    assert GateState.of(gate.to_dict()) == gate
    assert GateState.of({"not_gated": "its sink is a file sink"}) is None and GateState.of(None) is None


def test_one_upgrade_at_a_time_and_what_a_person_can_do_about_it(tmp_path: Path) -> None:
    jobs = str(write_jobs(tmp_path))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    with pytest.raises(InvalidInput, match="invalid upgrade mode 'sideways'"):
        begin(job, "v2", mode="sideways")
    upgrade = begin(job, "v2")
    held = read_lease(job.store.storage, "orders")
    assert held is not None and held.holder == upgrade_holder(upgrade.id) and upgrade.phase is Phase.SAVEPOINTING
    assert held.holder == f"upgrade:{upgrade.id}@{default_holder()}", "driven by this process"
    with pytest.raises(Refused, match=rf"job orders has upgrade {upgrade.id} to v2 in progress \(SAVEPOINTING\)"):
        begin(job, "v2")
    assert [u.id for u in Upgrades(job.store.storage).list("orders")] == [upgrade.id]

    cancelled = cancel(job, upgrade)  # before its cutover: an abort
    assert cancelled.phase is Phase.ABORTING and cancelled.error == "cancelled"
    cancelled.cutover_at = "2026-11-24T00:00:00Z"
    cancelled.phase = Phase.CONFIRMING
    assert cancel(job, cancelled).phase is Phase.ROLLING_BACK  # after it: a rollback

    for phase, error in ((Phase.BLOCKED, Refused), (Phase.ABORTED, UpgradeFailed), (Phase.ROLLED_BACK, UpgradeFailed)):
        with pytest.raises(error, match=f"{phase}"):
            outcome(Upgrade(id="up-x", job="orders", to_version="v2", phase=phase))
    outcome(Upgrade(id="up-x", job="orders", to_version="v2", phase=Phase.DONE))


def test_an_upgrade_is_refused_while_another_operation_holds_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = str(write_jobs(tmp_path))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    other = acquire(job.store.storage, "orders", "someone@host:1", "deploy", ttl=60)
    other.keep()
    started = time.monotonic()
    assert main(["upgrade", "orders", "--version", "v2", "--jobs", jobs]) == 4
    assert "job orders is busy: someone@host:1 for deploy" in capsys.readouterr().err
    assert time.monotonic() - started < 30 and Upgrades(job.store.storage).list("orders") == []  # nothing recorded
    assert main(["upgrade", "orders", "--resume", "--jobs", jobs]) == 3  # nothing to resume
    assert "job orders has no upgrade in progress" in capsys.readouterr().err
    assert main(["upgrade", "orders", "--show", "--jobs", jobs]) == 2
    assert "job orders has no upgrades yet" in capsys.readouterr().err


def test_a_delta_commit_that_lost_a_race_is_told_from_other_failures() -> None:
    """Both versions append to one table during a blue/green upgrade, and the new one may add a column: a commit
    that lost to the other's is refused by Delta's optimistic concurrency and is tried again (gate.py)."""
    lost = [
        "An error occurred while calling o1027.save.\n: io.delta.exceptions.MetadataChangedException: [DELTA_METADATA_"
        "CHANGED] MetadataChangedException: The metadata of the Delta table has been changed by a concurrent update",
        ": io.delta.exceptions.ConcurrentAppendException: [DELTA_CONCURRENT_APPEND] Files were added ...",
        ": io.delta.exceptions.ProtocolChangedException: [DELTA_PROTOCOL_CHANGED] ...",
    ]
    assert all(LOST_RACE.search(text) for text in lost)
    assert not LOST_RACE.search(": org.apache.spark.sql.AnalysisException: [DELTA_FAILED_TO_MERGE_FIELDS] ...")


# -- one process drives an upgrade (issue 51, 5 and 7)


class Worker:
    """tests/support/upgrade_worker.py, a process of its own: its copy of the upgrade, read when it started."""

    def __init__(self, jobs: str, upgrade_id: str, holder: str | None = None) -> None:
        argv = [sys.executable, "-m", "tests.support.upgrade_worker", jobs, "orders", upgrade_id]
        self.process = subprocess.Popen(
            argv + ([holder] if holder else []),
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.read = self._answer()

    def send(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 120)
        assert ready, "the worker said nothing within 120 s"
        line = self.process.stdout.readline()
        assert line, f"the worker ended ({self.process.poll()})"
        return dict(json.loads(line))

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no clean-up of its own, its lease left as it was
        self.process.wait()


REPO = Path(__file__).resolve().parents[2]


def _green_catching_up(tmp_path: Path, **settings: Any) -> tuple[JobContext, Upgrade]:
    """A blue/green upgrade whose green has not committed its batches yet (it waits): the old and new deployments as
    their heartbeats tell (no drivers)."""
    job = Settings(jobs_file=str(write_jobs(tmp_path))).resolve().job("orders")
    for deployment_id, version in (("dp-old", "v1"), ("dp-new", "v2")):
        checkpoint = str(tmp_path / deployment_id)
        job.deployments.put(Deployment(deployment_id, "orders", version, checkpoint, restored_batch_id=5))
    _beat(job)
    upgrade = Upgrade(
        new_upgrade_id(), "orders", "v2", mode="blue_green", old_deployment="dp-old", new_deployment="dp-new"
    )
    upgrade.settings = asdict(UpgradeSettings(min_batches=2, lag_must_fall=False, **settings))
    upgrade.deadline = time.time() + 600
    Upgrades(job.store.storage).put(upgrade.move(Phase.CATCHING_UP, "green started"))
    return job, upgrade


def _beat(job: JobContext, green: State = State.RUNNING) -> None:
    """Fresh heartbeats (a test slower than the heartbeat timeout would find them LOST)."""
    now = time.time()
    job.deployments.write_status("orders", "dp-old", DeploymentStatus(State.RUNNING, now, last_batch_id=40))
    error = "STREAM_FAILED" if green is State.FAILED else None
    job.deployments.write_status("orders", "dp-new", DeploymentStatus(green, now, last_batch_id=5, error_class=error))


def _stored(job: JobContext, upgrade_id: str) -> tuple[str, Phase]:
    data, token = job.store.storage.read_with_token(f"jobs/orders/upgrades/{upgrade_id}.json")
    return token, Upgrade.from_json(data, "here").phase


def test_a_copy_read_before_another_process_wrote_is_refused_and_the_phase_never_goes_back(tmp_path: Path) -> None:
    """The record is written by compare-and-swap: a copy that another writer overtook is refused, nothing written (it
    would take the upgrade back to what it saw); a new record is created only where none of its id exists."""
    job, upgrade = _green_catching_up(tmp_path)
    upgrades = Upgrades(job.store.storage)
    first, stale = upgrades.get("orders", upgrade.id), upgrades.get("orders", upgrade.id)
    upgrades.put(first.move(Phase.ABORTING, "cancelled"))
    copy = r"it is ABORTING now \(cancelled; this process's copy: CATCHING_UP\)\. Another process drives it"
    with pytest.raises(UpgradeMovedOn, match=rf"upgrade {upgrade.id} of job orders changed since .* {copy}"):
        upgrades.put(stale.move(Phase.CATCHING_UP, "green catching up"))
    with pytest.raises(UpgradeMovedOn):
        upgrades.check(stale)
    upgrades.check(first)  # its own write: still the record it holds
    with pytest.raises(UpgradeMovedOn):
        upgrades.put(Upgrade(upgrade.id, "orders", "v3"))  # a second record of one id
    assert upgrades.get("orders", upgrade.id).phase is Phase.ABORTING
    assert "token" not in first.to_dict() and Upgrade.from_json(first.to_json(), "here") == first


def test_two_processes_advance_one_upgrade_one_drives_it_and_a_stale_copy_never_writes(tmp_path: Path) -> None:
    """Issue 51 (5): two processes advance one upgrade from their own copies. While the first one's lease is live, the
    second is refused (LeaseHeld, naming the first), nothing done. The first moves the upgrade on and is killed; the
    second takes its lease at once (its process is gone) but its copy is older than the record: it stops and says so,
    and the phase does not go back. A process that reads it afresh goes on."""
    job, upgrade = _green_catching_up(tmp_path, answer_seconds=0.5)
    jobs = str(tmp_path / "jobs.toml")
    first, second = Worker(jobs, upgrade.id), Worker(jobs, upgrade.id)
    try:
        assert first.read["read"] == second.read["read"] == "CATCHING_UP"
        assert first.send("advance") == {"phase": "CATCHING_UP"}, "green catching up: it waits, the lease kept"
        held = read_lease(job.store.storage, "orders")
        assert held is not None and held.holder.startswith(f"upgrade:{upgrade.id}@") and not held.expired()
        assert held.holder.endswith(f":{ProcessId.of(first.read['pid']).key}"), held.holder
        before = _stored(job, upgrade.id)

        _beat(job)
        refused = second.send("advance")
        assert refused["refused"] == "LeaseHeld" and held.holder in refused["error"], refused
        assert _stored(job, upgrade.id) == before, "the second process did nothing"

        _beat(job, green=State.FAILED)
        assert first.send("advance") == {"phase": "ABORTING"}
        first.kill()
        _beat(job, green=State.FAILED)
        stale = second.send("advance")  # its copy: CATCHING_UP, read before the first process wrote
        assert stale["refused"] == "UpgradeMovedOn", stale
        assert (
            "it is ABORTING now" in stale["error"]
            and "copy: CATCHING_UP). Another process drives it" in (stale["error"])
        )
        assert _stored(job, upgrade.id)[1] is Phase.ABORTING, "the phase did not go back"

        third = Worker(jobs, upgrade.id)
        try:
            assert third.read["read"] == "ABORTING" and third.send("advance") == {"phase": "ABORTED"}
        finally:
            third.kill()
    finally:
        first.kill()
        second.kill()
    phases = [entry["phase"] for entry in Upgrades(job.store.storage).get("orders", upgrade.id).history]
    assert phases[phases.index("ABORTING") :] == ["ABORTING", "ABORTED"], phases
    assert read_lease(job.store.storage, "orders") is None, "the upgrade ended: its lease released"


def test_an_approval_whose_task_was_killed_is_aborted_by_the_next_apply_once_its_lease_expired(tmp_path: Path) -> None:
    """Issue 51 (7): `UpgradeJobOperator(approve=True)` asked a person (run.py `await_approval`, the DAG run's lease
    kept for the approval timeout and the upgrade's lease time) and its task was killed. While that lease is live,
    `apply` waits for the person's upgrade and `upgrade --resume` is refused; once it expired, the next `apply` aborts
    the upgrade (nothing was launched), says why, and watches the old version again: it failed meanwhile, so it is
    restarted. An approval that comes after the abort changes nothing."""
    jobs = write_jobs(tmp_path, extra='desired = { version = "v2" }')
    job = Settings(jobs_file=str(jobs)).resolve().job("orders")
    old = Deployment("dp-20261128T000000000Z-0001", "orders", "v1", str(tmp_path / "c1"))
    job.deployments.put(old)
    failed = DeploymentStatus(State.FAILED, time.time() - 3600, last_batch_id=7, error_class="STREAM_FAILED")
    job.deployments.write_status("orders", old.id, failed)  # it failed while the person was asked
    run = airflow_holder("upgrade_my_job", "manual__2026-11-28T00:00:00+00:00")
    upgrade = Upgrade(
        id=new_upgrade_id(),
        job="orders",
        to_version="v2",
        mode="stop_restore",
        requested_by="airflow:upgrade_my_job/upgrade",
        request_id=f"{run}/upgrade/-1",
        old_deployment=old.id,
        old_version="v1",
        savepoint="sp-20261128T000000Z-0001",
        settings=asdict(UpgradeSettings(lease_seconds=2.0)),  # the lease outlives the wait by 2 s, not 30 minutes
    )
    upgrades = Upgrades(job.store.storage)
    upgrades.put(upgrade.move(Phase.LAUNCHING, "pre-flight passed"))

    task = Worker(str(jobs), upgrade.id, holder=run)
    try:
        assert task.send("ask 6") == {"phase": "LAUNCHING"}  # waits up to 6 s for the person
        asked = upgrades.get("orders", upgrade.id)
        held = read_lease(job.store.storage, "orders")
        assert asked.awaits_approval and held is not None and held.holder == upgrade_holder(upgrade.id, run)
        waiting = apply_job(job)
        assert waiting.step.action is Action.WAIT and "a person's upgrade" in waiting.step.reason, waiting
        assert main(["upgrade", "orders", "--resume", "--jobs", str(jobs)]) == 4, "the lease is live: refused"
        assert read_lease(job.store.storage, "orders") == held and not held.expired(), "all of it while it was live"
    finally:
        task.kill()  # the task is killed while it waits: no answer, no timeout event will reach it
    assert upgrades.get("orders", upgrade.id).phase is Phase.LAUNCHING
    _until(lambda: held.expired(), "the approval's lease to expire")

    applied = apply_job(job)
    assert applied.ok and applied.step.action is Action.ABORT_UPGRADE, applied
    aborted = upgrades.get("orders", upgrade.id)
    assert aborted.phase is Phase.ABORTED and aborted.new_deployment is None, aborted.history
    assert aborted.error is not None and aborted.error.startswith("not approved: a person was asked"), aborted.error
    assert "the task that asked is gone" in aborted.error and held.holder in aborted.error, aborted.error
    assert f"{Phase.ABORTED}" in applied.outcome, applied.outcome
    assert [d.id for d in job.deployments.list("orders")] == [old.id], "nothing was launched"
    assert read_lease(job.store.storage, "orders") is None
    again = next_step(loop_context(job))
    assert again.action is Action.RESTART and old.id in again.reason, again  # the old version, watched again

    late = Settings(jobs_file=str(jobs), holder=run).resolve().job("orders")
    with pytest.raises(UpgradeMovedOn, match="it is ABORTED now"):
        approve(late, asked, "oncall")  # the answer on the task's copy, read before the abort
    with pytest.raises(Refused, match="came too late"):
        approve(late, upgrades.get("orders", upgrade.id), "oncall")
    assert upgrades.get("orders", upgrade.id).phase is Phase.ABORTED and read_lease(job.store.storage, "orders") is None


def _until(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.1)
