"""The jobs file, deployments' observed state, the bad inputs of deploy/stop/status, and what deploy reads
before it decides (no JVM needed except where spark-submit itself is the subject)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.errors import InvalidInput, NotFound
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DEFAULT_RESTORE, DeployRequest, deploy, submit_spec
from airflow_plugin.core.jobs.deployments import Deployments, observed_state
from airflow_plugin.core.jobs.fresh_start import build_of
from airflow_plugin.core.jobs.launcher import cluster_ids, process_seen, redact
from airflow_plugin.core.jobs.spec import load_jobs
from airflow_plugin.core.lease import read_lease
from airflow_plugin.core.process import Liveness
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import Kind, Manifest, SnapshotStatus, Trigger, new_snapshot_id
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.sources.kafka import KAFKA_CONF, KAFKA_ENV
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.timestamps import utc_now
from tests.support.jobs import STUBBORN_JOB, write_jobs
from tests.support.processes import elsewhere_handle, gone_handle
from tests.support.synthetic import add_batch, write_checkpoint


def test_jobs_file_is_parsed_with_paths_relative_to_it(tmp_path: Path) -> None:
    job = Settings(jobs_file=str(write_jobs(tmp_path))).resolve().spec("orders")
    assert job.store == str(tmp_path / "store") and job.checkpoint_root == str(tmp_path / "checkpoints")
    assert job.args == ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]
    assert job.default_version == "v1" and job.version("v2").args == ["--variant", "2"]
    assert job.trigger_seconds == 1.0 and job.conf == {"spark.sql.shuffle.partitions": "3"}


@pytest.mark.parametrize(
    ("extra", "error", "message"),
    [
        ('[jobs.bad]\nstore = "s"\ncheckpoint_root = "c"', InvalidInput, "declares no versions"),
        ('[jobs.bad]\nversions.v1 = { application = "a.py" }\ndelivery = "twice"', InvalidInput, "delivery 'twice'"),
        ('[jobs.bad]\nversions.v1 = { application = "a.py" }\ntrigger_interval = "soon"', InvalidInput, "interval"),
        ("[jobs.bad\n", InvalidInput, "is not valid TOML"),
        (
            '[jobs.bad]\nversions.v1 = { application = "a.py" }\ntrigger_intervall = "2 s"',
            InvalidInput,
            "trigger_intervall",
        ),
        ('[jobs.bad]\nversions.v1 = { application = "a.py", confs = {} }', InvalidInput, "versions.v1 has unknown"),
        ('[jobs.bad]\nversions.v1 = { application = "a.py", script = "s.py" }', InvalidInput, "one of the two"),
        ("[jobs.bad]\nversions.v1 = { args = [] }", InvalidInput, "an application .* or a script"),
        ('[jobs.bad]\nversions.v1 = { script = "s.py", migrate = "m:f" }', InvalidInput, "a script takes no migrate"),
    ],
)
def test_bad_jobs_files(tmp_path: Path, extra: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        load_jobs(str(write_jobs(tmp_path, extra=extra)))


def test_unknown_job_and_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = str(write_jobs(tmp_path))
    with pytest.raises(NotFound, match=r"unknown job 'payments'.*declared jobs are orders"):
        Settings(jobs_file=jobs).resolve().spec("payments")
    assert main(["deploy", "orders", "--version", "v9", "--jobs", jobs]) == 3
    assert "job orders has no version 'v9': declared versions are v1, v2" in capsys.readouterr().err
    assert main(["deploy", "orders", "--jobs", str(tmp_path / "missing.toml")]) == 3
    assert "jobs file" in capsys.readouterr().err
    assert not (tmp_path / "store").exists() and not (tmp_path / "checkpoints").exists()


def test_failing_spark_submit_reports_its_log_in_the_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = tmp_path / "job.py"
    app.write_text("import sys\nprint('boom: the input directory is not configured', file=sys.stderr)\nsys.exit(3)\n")
    jobs = str(write_jobs(tmp_path, application=str(app)))
    # latest-state (the deploy DAG's default) of a job that never ran: no state to lose, a fresh start, recorded
    code = main(["deploy", "orders", "--jobs", jobs, "--json", "--restore", "latest-state"])
    captured = capsys.readouterr()
    assert code == 9 and "spark-submit exited with code 3 before the job started" in captured.err
    assert "boom: the input directory is not configured" in captured.err
    [row] = json.loads(main(["status", "orders", "--jobs", jobs, "--json"]) == 0 and capsys.readouterr().out)
    assert row["state"] == "FAILED" and "boom" in row["error"] and row["error"].startswith("LAUNCH_FAILED")
    assert row["restored_from"] is None and "never started a query" in row["fresh_start"]
    # issue 53 (1): it has history but nothing was ever committed (no snapshot, no committed batch): nothing to lose,
    # so the next deploy (its arguments fixed) starts fresh too, and says so
    app.write_text(STUBBORN_JOB)
    assert main(["deploy", "orders", "--jobs", jobs, "--json", "--restore", "latest-state"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["restored_from"] is None and "never started a query" in second["fresh_start"], second
    assert main(["kill", "orders", "--jobs", jobs]) == 0
    capsys.readouterr()
    # a snapshot was taken of the job at some point (it failed): it had state, which latest-state cannot take over
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    failed = Manifest(
        new_snapshot_id(Kind.SAVEPOINT), "orders", Kind.SAVEPOINT, Trigger.MANUAL, SnapshotStatus.FAILED, "x", utc_now()
    )
    store.add(failed)
    assert main(["deploy", "orders", "--jobs", jobs, "--restore", "latest-state"]) == 3
    error = capsys.readouterr().err
    assert "job orders has 2 earlier deployment(s) but no state to take over" in error
    assert "deploy with --restore none for a fresh start" in error


def test_a_query_that_started_and_failed_before_its_first_commit_has_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 53 (1), and its limit: latest-state starts fresh only where no query ever started. A query that started
    and failed before its first commit left the positions it began at (Kafka's `latest` of then) in its checkpoint:
    starting fresh would skip what came since, so latest-state refuses."""
    jobs = str(write_jobs(tmp_path))
    deployments = Deployments(open_storage(str(tmp_path / "store")))
    checkpoint = tmp_path / "checkpoints" / "orders" / "dp-20260101T000000000Z-0001"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"q-1"}')
    (checkpoint / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"topic":{"0":1234}}')
    started = Deployment("dp-20260101T000000000Z-0001", "orders", "v1", str(checkpoint))
    deployments.put(started)
    failed = DeploymentStatus(State.FAILED, time.time(), query_id="q-1", error_class="STREAM_FAILED")
    deployments.write_status("orders", started.id, failed)
    assert main(["deploy", "orders", "--jobs", jobs, "--restore", "latest-state"]) == 3
    assert "1 earlier deployment(s) but no state to take over" in capsys.readouterr().err
    assert [d.id for d in deployments.list("orders")] == [started.id], "nothing deployed"


def test_missing_spark_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert main(["deploy", "orders", "--jobs", str(write_jobs(tmp_path))]) == 9
    assert "spark-submit not found" in capsys.readouterr().err


def test_stop_without_a_running_deployment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = str(write_jobs(tmp_path))
    assert main(["stop", "orders", "--jobs", jobs]) == 4
    assert "job orders has no running deployment: nothing to stop" in capsys.readouterr().err
    deployments = Deployments(open_storage(str(tmp_path / "store")))
    deployments.put(Deployment(id="dp-20261121T000000000Z-0001", job="orders", version="v1", checkpoint="c"))
    deployments.write_status("orders", "dp-20261121T000000000Z-0001", DeploymentStatus(State.STOPPED, time.time()))
    assert main(["stop", "orders", "--jobs", jobs, "--savepoint"]) == 4
    assert "(its latest deployment dp-20261121T000000000Z-0001 is STOPPED)" in capsys.readouterr().err
    assert (
        list(open_storage(str(tmp_path / "store")).list("jobs/orders/deployments/dp-20261121T000000000Z-0001/control/"))
        == []
    )


def test_a_heartbeat_that_stops_reads_as_lost() -> None:
    deployment = Deployment(id="dp-1", job="orders", version="v1", checkpoint="c")
    fresh = DeploymentStatus(State.RUNNING, updated_at=time.time())
    stale = DeploymentStatus(State.RUNNING, updated_at=time.time() - 31)
    assert observed_state(deployment, fresh, timeout=30) is State.RUNNING
    assert observed_state(deployment, stale, timeout=30) is State.LOST
    assert observed_state(deployment, DeploymentStatus(State.STOPPED, time.time() - 999), timeout=30) is State.STOPPED
    gone = Deployment(
        id="dp-2",
        job="orders",
        version="v1",
        checkpoint="c",
        launcher=gone_handle(),
    )
    assert observed_state(gone, fresh, timeout=30) is State.LOST  # its driver process is gone
    elsewhere = replace(gone, launcher=elsewhere_handle())  # another container's: its heartbeat speaks for it
    assert observed_state(elsewhere, fresh, timeout=30) is State.RUNNING
    assert observed_state(elsewhere, stale, timeout=30) is State.LOST


def test_launcher_helpers() -> None:
    shown = redact(["spark-submit", "--conf", "spark.hadoop.fs.s3a.secret.key=abc", "--conf", "a.b=c"])
    assert shown[2] == "spark.hadoop.fs.s3a.secret.key=***" and shown[4] == "a.b=c"
    log = "INFO Submitted application application_1700000000000_0042\n... driver-20261121060000-0001 ..."
    assert cluster_ids(log) == {"app_id": "application_1700000000000_0042", "driver_id": "driver-20261121060000-0001"}


def test_a_job_that_does_not_stop_in_time_keeps_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The heartbeat of a job that ignores stop requests: stop times out, withdraws its request, and
    neither the deployment nor its checkpoint is touched."""
    import threading

    jobs = str(write_jobs(tmp_path))
    store = open_storage(str(tmp_path / "store"))
    deployments = Deployments(store)
    deployment = Deployment(
        id="dp-20261121T000000000Z-0002", job="orders", version="v1", checkpoint=str(tmp_path / "ckpt")
    )
    deployments.put(deployment)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt/metadata").write_text("{}")
    done = threading.Event()

    def heartbeat() -> None:
        while not done.is_set():
            deployments.write_status(
                "orders", deployment.id, DeploymentStatus(State.RUNNING, time.time(), last_batch_id=7)
            )
            done.wait(0.2)

    beating = threading.Thread(target=heartbeat)
    beating.start()
    try:
        code = main(["stop", "orders", "--jobs", jobs, "--savepoint", "--timeout", "1"])
    finally:
        done.set()
        beating.join()
    err = capsys.readouterr().err
    assert code == 10 and "did not stop within 1s (state RUNNING, last batch 7)" in err
    assert "the job keeps running and nothing was deleted" in err
    assert deployments.requests("orders", deployment.id) == []  # the request was withdrawn
    assert deployments.get("orders", deployment.id).retired_at is None
    assert (tmp_path / "ckpt/metadata").exists() and not any(store.list("jobs/orders/snapshots/"))


def test_a_checkpoint_location_another_deployment_owns_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_plugin.core.jobs import deploy as deploy_module

    jobs = str(write_jobs(tmp_path))
    owned = tmp_path / "checkpoints/orders/dp-20261121T000000000Z-0003"
    owned.mkdir(parents=True)
    (owned / "metadata").write_text('{"id": "q"}')
    deployments = Deployments(open_storage(str(tmp_path / "store")))
    deployments.put(Deployment(id="dp-20261121T000000000Z-0003", job="orders", version="v1", checkpoint=str(owned)))
    deployments.write_status("orders", "dp-20261121T000000000Z-0003", DeploymentStatus(State.STOPPED, time.time()))
    monkeypatch.setattr(deploy_module, "new_deployment_id", lambda: "dp-20261121T000000000Z-0003")
    assert main(["deploy", "orders", "--jobs", jobs, "--restore", "none"]) == 4
    assert "owned by deployment dp-20261121T000000000Z-0003: every deployment needs its own" in capsys.readouterr().err
    assert (owned / "metadata").read_text() == '{"id": "q"}'


class _Decided(Exception):
    """Raised where deploy writes its deployment: what it read before is its planning."""


def test_deploys_planning_reads_the_deployments_the_catalog_and_the_manifest_once(
    s3_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`deploy --restore latest-savepoint`, up to its first write but its lease: the lease (acquire: one write
    naming the released record's token; release: the released record), the deployment index, the catalog and
    the manifest. Its steps (the refusal while one may run, the new location's check, the restore plan) use
    what it read: no conditional re-read (history_bench.py measures the same at 1,000 snapshots)."""
    jobs = str(write_jobs(tmp_path, extra=f'store = "{s3_store}"'))
    store = Settings(jobs_file=jobs).resolve().job("orders").store
    checkpoint = write_checkpoint(tmp_path / "live", batches=3)
    manifest = create_snapshot(store, open_storage(str(checkpoint)), SnapshotRequest(job="orders", job_version="v1"))
    records = Deployments(store.storage)
    old = Deployment("dp-20261121T000000000Z-0001", "orders", "v1", str(checkpoint), retired_at="2026-11-21T01:00:00Z")
    records.write_status("orders", old.id, DeploymentStatus(State.STOPPED, time.time(), last_batch_id=2))
    records.put(old)
    calls: Counter[str] = Counter()

    def record(model: object, **_: object) -> None:
        calls[model.name] += 1  # type: ignore[attr-defined]

    def decided(self: Deployments, deployment: Deployment) -> None:
        assert deployment.restored_from == manifest.id
        raise _Decided

    def planning() -> Counter[str]:
        calls.clear()
        ctx = Settings(jobs_file=jobs).resolve().job("orders")  # a new process's view: nothing cached
        client = ctx.store.storage.client
        client.meta.events.register("before-call.s3", record)
        try:
            with pytest.raises(_Decided):
                deploy(ctx, DeployRequest(restore="latest-savepoint"))
        finally:
            client.meta.events.unregister("before-call.s3", record)
        return Counter(calls)

    monkeypatch.setattr(Deployments, "put", decided)
    first = planning()  # the job's first lease: no released record to name, so it is read
    assert first["GetObject"] >= 3 and "ListObjectsV2" not in first, first
    assert read_lease(store.storage, "orders") is None  # released
    assert planning() == {"PutObject": 2, "GetObject": 3}
    assert planning() == {"PutObject": 2, "GetObject": 3}


@pytest.mark.slow
def test_kill_force_stops_a_job_that_ignores_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through a real spark-submit process: stop times out, kill takes down its whole process group."""
    app = tmp_path / "stubborn.py"
    app.write_text(STUBBORN_JOB)
    jobs = str(write_jobs(tmp_path, application=str(app)))
    assert main(["deploy", "orders", "--jobs", jobs, "--json"]) == 0
    deployment = json.loads(capsys.readouterr().out)["deployment"]
    assert main(["stop", "orders", "--jobs", jobs, "--timeout", "2"]) == 10
    capsys.readouterr()
    record = Deployments(open_storage(str(tmp_path / "store"))).get("orders", deployment)
    assert process_seen(record.launcher) is Liveness.ALIVE
    assert main(["kill", "orders", "--jobs", jobs]) == 0
    assert process_seen(record.launcher) is Liveness.GONE
    assert main(["status", "orders", "--jobs", jobs, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert row["state"] == "FAILED" and row["error"].startswith("KILLED")


def test_a_relative_application_is_found_next_to_the_jobs_file_or_in_the_installed_packages(tmp_path: Path) -> None:
    """The example jobs file works wherever it is copied: spark_jobs/jobs/... is the installed package's."""
    (tmp_path / "mine.py").touch()
    extra = '[jobs.example]\nversions.v1 = { application = "spark_jobs/jobs/windowed/v1.py" }\n'
    jobs = load_jobs(str(write_jobs(tmp_path, application="mine.py", extra=extra)))
    assert jobs["orders"].version("v1").application == str(tmp_path / "mine.py")
    import spark_jobs

    installed = Path(spark_jobs.__file__).parent / "jobs" / "windowed" / "v1.py"
    assert jobs["example"].launchable("v1").application == str(installed.resolve())


def test_a_missing_application_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = str(write_jobs(tmp_path, application="nowhere.py", touch=False))
    assert main(["deploy", "orders", "--jobs", jobs]) == 3
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nowhere.py'}, does not exist" in err and "versions.v1.application" in err
    assert not (tmp_path / "store").exists()


def test_a_script_version_runs_the_script_under_the_runtimes_script_driver(tmp_path: Path) -> None:
    (tmp_path / "count.py").touch()
    extra = '[jobs.counts]\nversions.v1 = { script = "count.py", args = ["--x"] }\n'
    ctx = Settings(jobs_file=str(write_jobs(tmp_path, extra=extra))).resolve().job("counts")
    version = ctx.spec.launchable("v1")
    assert (version.script, version.code) == (str(tmp_path / "count.py"), str(tmp_path / "count.py"))
    spec = submit_spec(ctx, version, "dp-1", str(tmp_path / "checkpoint"), {})
    assert spec.application.endswith("spark_jobs/tools/run_script.py") and Path(spec.application).is_file()
    assert spec.app_args[:2] == ["--script", str(tmp_path / "count.py")] and spec.app_args[-1] == "--x"
    assert build_of(ctx, version) == [str(tmp_path / "count.py"), *ctx.spec.args, "--x"]
    (tmp_path / "count.py").unlink()
    with pytest.raises(NotFound, match=r"versions\.v1\.script"):
        ctx.spec.launchable("v1")


@pytest.mark.parametrize(
    ("value", "seconds"), [('"10 minutes"', "600"), ("45", "45"), ('"90 s"', "90"), ('"1 hour"', "3600")]
)
def test_a_script_versions_start_timeout_reaches_the_script_driver(tmp_path: Path, value: str, seconds: str) -> None:
    (tmp_path / "count.py").touch()
    extra = f'[jobs.counts]\nversions.v1 = {{ script = "count.py", start_timeout = {value} }}\n'
    ctx = Settings(jobs_file=str(write_jobs(tmp_path, extra=extra))).resolve().job("counts")
    spec = submit_spec(ctx, ctx.spec.launchable("v1"), "dp-1", str(tmp_path / "checkpoint"), {})
    assert spec.app_args[:4] == ["--script", str(tmp_path / "count.py"), "--script-start-timeout", seconds]
    from spark_jobs.runtime.script import _parser

    assert _parser().parse_known_args(spec.app_args)[0].script_start_timeout == float(seconds)


@pytest.mark.parametrize(
    ("version", "refusal"),
    [
        ('{ script = "count.py", start_timeout = "soon" }', r"versions\.v1\.start_timeout = 'soon' is not a duration"),
        ('{ script = "count.py", start_timeout = 0 }', r"versions\.v1\.start_timeout = 0 must be longer than 0"),
        ('{ application = "count.py", start_timeout = 60 }', r"versions\.v1: start_timeout is the time a script"),
    ],
)
def test_a_start_timeout_that_cannot_apply_is_refused(tmp_path: Path, version: str, refusal: str) -> None:
    (tmp_path / "count.py").touch()
    jobs = write_jobs(tmp_path, extra=f"[jobs.counts]\nversions.v1 = {version}\n")
    with pytest.raises(InvalidInput, match=refusal):
        load_jobs(str(jobs))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, 600.0), ('"20 minutes"', 1200.0), ("90", 90.0), ('"1 hour"', 3600.0), ('"2h"', 7200.0)],
)
def test_the_preflight_timeout_is_the_jobs_to_set(tmp_path: Path, value: str | None, seconds: float) -> None:
    extra = (
        ""
        if value is None
        else f'[jobs.counts]\npreflight_timeout = {value}\nversions.v1 = {{ application = "job.py" }}\n'
    )
    jobs = load_jobs(str(write_jobs(tmp_path, extra=extra)))
    assert jobs["counts" if value else "orders"].preflight_timeout == seconds


def test_a_preflight_timeout_that_is_no_time_is_refused(tmp_path: Path) -> None:
    jobs = write_jobs(
        tmp_path, extra='[jobs.counts]\npreflight_timeout = "never"\nversions.v1 = { application = "job.py" }\n'
    )
    with pytest.raises(InvalidInput, match=r"jobs\.counts.*preflight_timeout = 'never' is not a duration: give"):
        load_jobs(str(jobs))


def test_every_duration_of_the_jobs_file_takes_the_one_grammar(tmp_path: Path) -> None:
    """Issue 43: `trigger_interval = "1 hour"` was refused by the engine (and accepted by the runtime); hours,
    days and words now read the same in every duration key, and a plain number keeps its meaning (seconds)."""
    extra = (
        '[jobs.hourly]\ntrigger_interval = "1 hour"\nheartbeat_timeout = "2 minutes"\npreflight_timeout = "1h"\n'
        'kafka = { bootstrap_servers = "broker:9092", timeout = "15 s" }\n'
        'versions.v1 = { application = "job.py" }\nretention.checkpoint = { max_age = "2 days" }\n'
        '[jobs.plain]\ntrigger_interval = " 500 MS "\nheartbeat_timeout = 45\n'
        'kafka = { bootstrap_servers = "b:9092", timeout = 4 }\n'
        'versions.v1 = { application = "job.py" }\n'
    )
    jobs = load_jobs(str(write_jobs(tmp_path, extra=extra)))
    hourly, plain = jobs["hourly"], jobs["plain"]
    assert hourly.trigger_interval == "1 hour" and hourly.trigger_seconds == 3600.0
    assert (hourly.heartbeat_timeout, hourly.preflight_timeout, hourly.kafka.timeout_s) == (120.0, 3600.0, 15.0)
    assert plain.trigger_seconds == 0.5 and (plain.heartbeat_timeout, plain.kafka.timeout_s) == (45.0, 4.0)
    from spark_jobs.runtime.args import parse_trigger

    # what the engine accepts, the runtime accepts too (the launcher hands trigger_interval over as written),
    # and gives Spark in a form it reads
    for spec in (hourly, plain):
        trigger = parse_trigger(spec.trigger_interval)
        assert trigger.seconds == spec.trigger_seconds
        assert trigger.spark_kwargs() == {"processingTime": f"{round(spec.trigger_seconds * 1000)} milliseconds"}


@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        ('trigger_interval = "1 fortnight"', r"\[jobs\.bad\] trigger_interval = '1 fortnight' has an unknown unit"),
        ('trigger_interval = "0 seconds"', r"\[jobs\.bad\] trigger_interval = '0 seconds' must be longer than 0"),
        ("trigger_interval = 5", r"\[jobs\.bad\] trigger_interval = 5 needs a unit"),  # as before: no bare number
        ('trigger_interval = "1 hour 5 minutes"', r"trigger_interval = '1 hour 5 minutes' is not a duration"),
        ('heartbeat_timeout = "soon"', r"\[jobs\.bad\] heartbeat_timeout = 'soon' is not a duration"),
        ("heartbeat_timeout = -5", r"\[jobs\.bad\] heartbeat_timeout = -5 must not be negative"),
        ("heartbeat_timeout = 0", r"\[jobs\.bad\] heartbeat_timeout = 0 must be longer than 0"),
        (
            'kafka = { bootstrap_servers = "b:9092", timeout = "ten" }',
            r"\[jobs\.bad\] kafka\.timeout = 'ten' is not a duration",
        ),
    ],
)
def test_a_duration_the_grammar_refuses_names_the_key_and_the_accepted_forms(
    tmp_path: Path, setting: str, refusal: str
) -> None:
    jobs = write_jobs(tmp_path, extra=f'[jobs.bad]\n{setting}\nversions.v1 = {{ application = "job.py" }}\n')
    with pytest.raises(InvalidInput, match=refusal) as info:
        load_jobs(str(jobs))
    assert '"500ms", "90s", "1.5 s", "2 min", "1 hour", "2 days", "1 week"' in str(info.value)


def test_versions_are_listed_in_natural_order_and_the_declared_default_wins(tmp_path: Path) -> None:
    """Issue 45: versions sorted by name put v10 before v2."""
    versions = "".join(f'versions.{v} = {{ application = "job.py" }}\n' for v in ("v10", "v2", "v9"))
    extra = f'[jobs.many]\n{versions}[jobs.pinned]\ndefault_version = "v10"\n{versions}'
    jobs = load_jobs(str(write_jobs(tmp_path, extra=extra)))
    assert jobs["many"].version_names == ["v2", "v9", "v10"]
    assert jobs["many"].default_version == "v2"  # none declared: the first in natural order (by name: v10)
    assert jobs["pinned"].default_version == "v10" and jobs["pinned"].version(None).name == "v10"
    with pytest.raises(NotFound, match=r"has no version 'v3': declared versions are v2, v9, v10$"):
        jobs["many"].version("v3")


def test_a_throwaway_run_past_the_preflight_timeout_is_killed_and_the_error_names_the_setting(tmp_path: Path) -> None:
    """The pre-flight's (and a migration check's) Spark application gets the job's preflight_timeout: past it,
    it is killed, and the refusal says which setting to raise. A real spark-submit, killed a second in."""
    from airflow_plugin.core.errors import Refused
    from airflow_plugin.core.upgrades.preflight import run_throwaway

    (tmp_path / "slow.py").write_text("import time\n\ntime.sleep(120)\n")
    extra = '[jobs.counts]\npreflight_timeout = 1\nversions.v1 = { application = "slow.py" }\n'
    ctx = Settings(jobs_file=str(write_jobs(tmp_path, extra=extra))).resolve().job("counts")
    started = time.monotonic()
    with pytest.raises(Refused, match=r"did not finish within 1s .* raise preflight_timeout of job counts"):
        run_throwaway(ctx, ctx.spec.launchable("v1"), "pf-1", str(tmp_path / "cp"), {}, (), what="preflight")
    assert time.monotonic() - started < 60  # killed at its timeout, not left to run its two minutes


def test_a_kafka_jobs_broker_reaches_the_driver_in_its_conf_and_environment_not_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 43: `--kafka-bootstrap-servers HOST:PORT` appended to every driver's arguments broke a script whose own
    argparse refuses what it did not ask for. The job's arguments are now the jobs file's, nothing added."""
    monkeypatch.delenv(KAFKA_ENV, raising=False)
    (tmp_path / "count.py").touch()
    extra = (
        '[jobs.counts]\nkafka = { bootstrap_servers = "broker:9092" }\nargs = ["words"]\n'
        'versions.v1 = { script = "count.py", args = ["--strict"], foreach_batch = "idempotent" }\n'
        'versions.v2 = { application = "job.py" }\n'
    )
    ctx = Settings(jobs_file=str(write_jobs(tmp_path, extra=extra))).resolve().job("counts")
    for name in ("v1", "v2"):
        spec = submit_spec(ctx, ctx.spec.launchable(name), "dp-1", str(tmp_path / "checkpoint"), {})
        assert "--kafka-bootstrap-servers" not in spec.app_args and "broker:9092" not in spec.app_args
        assert spec.conf[KAFKA_CONF] == "broker:9092" and spec.env[KAFKA_ENV] == "broker:9092"
    script = submit_spec(ctx, ctx.spec.launchable("v1"), "dp-1", str(tmp_path / "checkpoint"), {})
    from spark_jobs.runtime.args import parse_args
    from spark_jobs.runtime.script import _parser

    own, rest = _parser().parse_known_args(script.app_args)
    assert own.script_foreach_batch == "idempotent"  # what the version declares, to the script driver
    assert parse_args(rest)[1] == ["words", "--strict"], "the script's argv: the jobs file's arguments only"
    orders = Settings(jobs_file=str(tmp_path / "jobs.toml")).resolve().job("orders")  # declares no kafka
    plain = submit_spec(orders, orders.spec.launchable("v1"), "dp-2", str(tmp_path / "checkpoint-2"), {})
    assert KAFKA_CONF not in plain.conf and KAFKA_ENV not in plain.env
    # the example job (the build contract) reads the broker handed over, unless its arguments name one
    from spark_jobs.jobs.windowed.common import KafkaInput, parse_job_args

    monkeypatch.setenv(KAFKA_ENV, "handed:9092")
    topic = ["--topic", "events", "--output", "out"]
    assert parse_job_args(topic).kafka == KafkaInput("handed:9092", "events", 1000)
    own = parse_job_args([*topic, "--kafka-bootstrap-servers", "own:9092"]).kafka
    assert own is not None and own.bootstrap_servers == "own:9092"
    monkeypatch.delenv(KAFKA_ENV)
    with pytest.raises(SystemExit):  # no broker at all: argparse's error names the fix
        parse_job_args(topic)


@pytest.mark.parametrize(
    ("version", "refusal"),
    [
        (
            '{ script = "count.py", foreach_batch = "yes" }',
            r"versions\.v1\.foreach_batch = 'yes': the one value is \"idempotent\", for a script whose foreachBatch",
        ),
        (
            '{ application = "count.py", foreach_batch = "idempotent" }',
            r"versions\.v1: foreach_batch declares a script's foreachBatch idempotent; an application declares its "
            r"sink in its build",
        ),
    ],
)
def test_a_foreach_batch_declaration_that_cannot_apply_is_refused(tmp_path: Path, version: str, refusal: str) -> None:
    (tmp_path / "count.py").touch()
    jobs = write_jobs(tmp_path, extra=f"[jobs.counts]\nversions.v1 = {version}\n")
    with pytest.raises(InvalidInput, match=refusal):
        load_jobs(str(jobs))
    assert load_jobs(str(write_jobs(tmp_path)))["orders"].version("v1").foreach_batch is None  # not declared


def test_a_deploy_continues_from_the_latest_state_and_a_fresh_start_asked_for_says_what_it_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43: `savepoints deploy` started empty by default while the deploy DAG continued from the latest state.
    One default now (the engine's, the CLI's; the operator's and the DAG's: tests/airflow): a job with history
    continues from its latest state, and a fresh start of a job with state, asked for by name, says which state at
    which batch it does not carry over (in the CLI's output and the deployment's record)."""
    jobs = str(write_jobs(tmp_path))
    store = Settings(jobs_file=jobs).resolve().job("orders").store
    checkpoint = write_checkpoint(tmp_path / "live", batches=3)
    manifest = create_snapshot(store, open_storage(str(checkpoint)), SnapshotRequest(job="orders", job_version="v1"))
    old = Deployment("dp-20261121T000000000Z-0001", "orders", "v1", str(checkpoint))
    Deployments(store.storage).put(old)
    Deployments(store.storage).write_status("orders", old.id, DeploymentStatus(State.STOPPED, time.time()))
    decided: list[Deployment] = []

    def decide(self: Deployments, deployment: Deployment) -> None:
        decided.append(deployment)
        raise _Decided

    monkeypatch.setattr(Deployments, "put", decide)

    def deployed(*flags: str) -> tuple[Deployment, str]:
        main(["deploy", "orders", "--jobs", jobs, *flags])
        return decided[-1], capsys.readouterr().err

    assert DeployRequest().restore == DEFAULT_RESTORE == "latest-state"
    continued, said = deployed()
    assert continued.restored_from == manifest.id and continued.fresh_start is None and "starts fresh" not in said

    fresh, said = deployed("--restore", "none")
    left = f"the job's latest state, savepoint {manifest.id} at batch 2, is not carried over"
    assert fresh.restored_from is None and fresh.fresh_start == f"restore none: {left}"
    assert f"WARNING airflow_plugin.core.jobs.deploy: deployment {fresh.id} of job orders starts fresh" in said
    assert left in said

    add_batch(checkpoint, 3)  # the last deployment's checkpoint is now newer than the snapshot: that is named
    fresh, said = deployed("--restore", "none")
    assert f"the live checkpoint of deployment {old.id} (v1) at batch 3, is not carried over" in str(fresh.fresh_start)
    assert f"{old.id} (v1) at batch 3" in said
