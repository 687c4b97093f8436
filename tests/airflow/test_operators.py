"""The Airflow layer without Spark: the hook's connections, the health trigger (run and serialized), the
deferrable sensor, and bad input: every task fails with a message that names the problem, and nothing is
written, stopped or deleted because of it."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_plugin.core.errors import Refused, UpgradeFailed
from airflow_plugin.core.jobs.deploy import submit_spec
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.lease import acquire, airflow_holder, break_lease, read_lease
from airflow_plugin.core.reconcile import record as reconcile_records
from airflow_plugin.core.reconcile.plan import APPLY
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.sources.kafka import KAFKA_CONF, KAFKA_ENV
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades, new_upgrade_id
from airflow_plugin.core.upgrades.steps import LEASE_SECONDS, UpgradeSettings, upgrade_holder
from airflow_plugin.hooks.savepoints import SavepointsHook
from airflow_plugin.operators.deployments import DeployJobOperator, StopJobOperator
from airflow_plugin.operators.leases import ReleaseLeaseOperator
from airflow_plugin.operators.reconcile import ApplyJobOperator
from airflow_plugin.operators.snapshots import SavepointOperator, VerifySnapshotOperator
from airflow_plugin.operators.upgrade import PreflightCheckOperator, RollbackOperator
from airflow_plugin.sensors.health import DeploymentHealthSensor
from airflow_plugin.triggers.health import DeploymentHealthTrigger
from airflow_plugin.triggers.jobs_file import FINGERPRINT, JobsFileChangedTrigger, fingerprint
from airflow_plugin.triggers.upgrade import UpgradeTrigger
from tests.support.jobs import write_jobs
from tests.support.synthetic import tree


class TaskInstance(SimpleNamespace):
    """What the operators use of Airflow's task instance: ids, and XComs pushed besides the return value."""

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def task_context() -> Any:
    return {"ti": TaskInstance(dag_id="test_dag", task_id="test_task", pushed={})}


CONTEXT: Any = task_context()
RUN = airflow_holder("test_dag", "manual")  # the lease holder of task_context()'s DAG run


# ---------------------------------------------------------------- hook


def test_the_store_connection_gives_endpoint_and_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    connection = {
        "conn_type": "aws",
        "login": "AKIDEXAMPLE",
        "password": "very-secret-key",
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_MY_STORE", json.dumps(connection))
    settings = SavepointsHook(aws_conn_id="my_store").s3_settings
    assert settings is not None
    assert (settings.endpoint_url, settings.region_name, settings.access_key_id) == (
        "http://127.0.0.1:9",
        "eu-west-1",
        "AKIDEXAMPLE",
    )
    assert settings.secret_access_key == "very-secret-key" and "very-secret-key" not in repr(settings)
    assert settings.child_env()["AWS_SECRET_ACCESS_KEY"] == "very-secret-key"  # the driver's environment only


def test_a_kafka_connection_names_the_broker_every_restore_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Airflow Kafka provider's connection: its extra is the client config. It wins over the jobs file."""
    extra = {"bootstrap.servers": "conn:9092", "group.id": "airflow", "security.protocol": "SASL_SSL"}
    extra["sasl.password"] = "very-secret"
    monkeypatch.setenv("AIRFLOW_CONN_MY_KAFKA", json.dumps({"conn_type": "kafka", "extra": extra}))
    jobs = str(write_jobs(tmp_path, extra='kafka = { bootstrap_servers = "file:9092" }'))
    hook = SavepointsHook(aws_conn_id=None, spark_conn_id=None, jobs_file=jobs, kafka_conn_id="my_kafka")
    job = hook.job_context("orders")
    assert job.kafka is not None and job.kafka.bootstrap_servers == "conn:9092"
    assert dict(job.kafka.config) == {"security.protocol": "SASL_SSL", "sasl.password": "very-secret"}
    assert "very-secret" not in repr(job.settings) and job.child_conf() == {KAFKA_CONF: "conn:9092"}
    assert job.child_env()[KAFKA_ENV] == "conn:9092"  # the driver's broker, not among the job's arguments
    without = SavepointsHook(aws_conn_id=None, spark_conn_id=None, jobs_file=jobs, kafka_conn_id="no_such_kafka")
    assert without.job_context("orders").kafka.bootstrap_servers == "file:9092"  # the jobs file's, then


def test_without_the_connection_boto3s_own_chain_is_used() -> None:
    assert SavepointsHook(aws_conn_id="no_such_connection").s3_settings is None


def test_the_connection_reaches_the_store_even_when_the_environment_points_elsewhere(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = s3_server.create_bucket(f"conn-{int(time.time() * 1000)}") + "/store"
    jobs = write_jobs(tmp_path, extra="").read_text().replace('store = "store"', f'store = "{store}"')
    (tmp_path / "jobs.toml").write_text(jobs)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("AIRFLOW_CONN_THE_STORE", s3_server.airflow_connection())
    operator = StopJobOperator(task_id="stop", job="orders", jobs_file=str(tmp_path / "jobs.toml"))
    operator.aws_conn_id = "the_store"
    with pytest.raises(AirflowFailException, match="job orders has no running deployment"):  # it read the store
        operator.execute(CONTEXT)


def test_a_connection_with_a_role_reaches_the_store_as_that_role_and_keeps_it_from_long_lived_drivers(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AWS connection that only names a role (`role_arn`), read as the Amazon provider reads it: the role is
    assumed through STS (moto's, on the embedded server) and the store is read with the assumed credentials, not the
    base ones. A deployment's driver, which runs for weeks, is refused those expiring credentials unless the
    connection says drivers have their own identity; a short Spark tool gets them as they are now."""
    store = s3_server.create_bucket(f"role-{int(time.time() * 1000)}") + "/store"
    role = "arn:aws:iam::123456789012:role/savepoints-store"
    extra = {"role_arn": role, "region_name": "us-east-1", "endpoint_url": s3_server.endpoint}
    extra["service_config"] = {"sts": {"endpoint_url": s3_server.endpoint}}
    monkeypatch.setenv("AIRFLOW_CONN_THE_ROLE", json.dumps({"conn_type": "aws", "extra": extra}))
    jobs = tmp_path / "jobs.toml"
    write_jobs(tmp_path)
    jobs.write_text(jobs.read_text().replace('store = "store"', f'store = "{store}"'))
    hook = SavepointsHook(aws_conn_id="the_role", spark_conn_id=None, jobs_file=str(jobs), kafka_conn_id=None)
    settings = hook.s3_settings
    assert settings is not None and settings.session is not None and settings.temporary
    used = settings.session.get_credentials().get_frozen_credentials()
    assert used.access_key != os.environ["AWS_ACCESS_KEY_ID"] and used.token, "the assumed role's, not the base keys"
    identity = settings.session.client("sts", endpoint_url=s3_server.endpoint).get_caller_identity()
    assert ":assumed-role/savepoints-store/" in identity["Arn"], identity

    job = hook.job_context("orders")
    from airflow_plugin.core.storage.s3 import _s3

    assert job.store.list("orders") == [], "the store was read"
    signer = _s3(settings).client._request_signer._credentials.get_frozen_credentials()
    assert signer.access_key == used.access_key, "with the assumed role's credentials"
    assert job.child_env()["AWS_ACCESS_KEY_ID"] == used.access_key, "a tool: the current credentials"
    with pytest.raises(Refused, match=r'credentials expire .* "driver_credentials": "own"') as refused:
        settings.child_env(lasting=True)
    assert used.secret_key not in str(refused.value) and used.access_key not in str(refused.value)
    version = job.spec.versions["v1"]
    with pytest.raises(Refused, match="credentials expire"):  # a deployment's driver would outlive them
        submit_spec(job, version, "d-1", "/tmp/checkpoint", {})
    assert submit_spec(job, version, "d-1", "/tmp/checkpoint", {}, lasting=False).env["AWS_SESSION_TOKEN"] == used.token

    extra["driver_credentials"] = "own"
    monkeypatch.setenv("AIRFLOW_CONN_THE_ROLE", json.dumps({"conn_type": "aws", "extra": extra}))
    own = SavepointsHook(aws_conn_id="the_role").s3_settings
    assert own is not None and own.child_env(lasting=True) == {
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
    }, "drivers get no keys: their own identity"


# ---------------------------------------------------------------- trigger and sensor


def _deployment(tmp_path: Path, state: State, last_batch: int | None, age: float = 0.0) -> tuple[str, str]:
    jobs = write_jobs(tmp_path)
    records = Deployments(open_storage(str(tmp_path / "store")))
    deployment = Deployment(id="dp-1", job="orders", version="v1", checkpoint=str(tmp_path / "ck"), restored_batch_id=4)
    records.put(deployment)
    records.write_status(
        "orders",
        "dp-1",
        DeploymentStatus(
            state, time.time() - age, last_batch_id=last_batch, error_class="BOOM" if state is State.FAILED else None
        ),
    )
    return str(jobs), deployment.id


def _first_event(trigger: DeploymentHealthTrigger) -> dict[str, Any]:
    async def first() -> Any:
        return await trigger.run().__anext__()

    return asyncio.run(first()).payload


class _AssetState:
    """Airflow's asset state store as a watcher's trigger sees it (`aget`, `aset`; the triggerer's own on 3.3+):
    the real one, in a running triggerer, is test_make_airflow's."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = value


def test_the_jobs_file_watcher_fires_on_each_change_once_and_not_on_its_first_look(tmp_path: Path) -> None:
    """What it saw is kept in the asset's state once its event is handed over: a triggerer started again does not
    fire for a change it reported, and fires for one made while none watched. Without that store (Airflow 3.1) it
    fires for the changes it sees."""
    jobs = tmp_path / "jobs.toml"
    jobs.write_text("[jobs.a]\n")
    kept = _AssetState()

    def change(note: str) -> str:
        jobs.write_text(f"{jobs.read_text()}# {note}\n")
        return str(fingerprint(str(jobs)))

    def watcher(store: _AssetState | None) -> Any:
        trigger = JobsFileChangedTrigger(str(jobs), poll_interval=0.02)
        if store is not None:
            trigger.asset_state_store = store
        return trigger.run()

    async def until_kept(value: str | None) -> None:
        async with asyncio.timeout(30):
            while kept.values.get(FINGERPRINT) != value:
                await asyncio.sleep(0.02)

    async def quiet(pending: asyncio.Future[Any]) -> None:
        await asyncio.sleep(0.2)  # some ten looks at the file: an event that should not be would be here by now
        assert not pending.done(), pending.result().payload if pending.done() else None

    async def stop(pending: asyncio.Future[Any], events: Any) -> None:
        pending.cancel()  # as the triggerer cancels a trigger
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        await events.aclose()

    async def scenario() -> list[dict[str, Any]]:
        fired = []
        events = watcher(kept)  # the first triggerer: its first look is kept, and fires nothing
        pending = asyncio.ensure_future(anext(events))
        await until_kept(fingerprint(str(jobs)))
        await quiet(pending)
        changed = change("v2")
        fired.append((await asyncio.wait_for(pending, 30)).payload)
        pending = asyncio.ensure_future(anext(events))  # the triggerer takes the next event: what it saw is kept
        await until_kept(changed)
        await stop(pending, events)

        events = watcher(kept)  # started again: nothing new to report
        pending = asyncio.ensure_future(anext(events))
        await quiet(pending)
        await stop(pending, events)

        change("while nobody watched")
        fired.append((await asyncio.wait_for(anext(watcher(kept)), 30)).payload)

        events = watcher(None)  # Airflow 3.1: no asset state; its first look fires nothing
        pending = asyncio.ensure_future(anext(events))
        await quiet(pending)
        change("v3")
        fired.append((await asyncio.wait_for(pending, 30)).payload)
        await events.aclose()
        return fired

    fired = asyncio.run(scenario())
    assert [event["jobs_file"] for event in fired] == [str(jobs)] * 3
    assert len({event["sha256"] for event in fired}) == 3 and fired[-1]["sha256"] == fingerprint(str(jobs))


@pytest.mark.parametrize(
    ("state", "last_batch", "age", "deadline_in", "expected"),
    [
        (State.RUNNING, 7, 0, 60, "healthy"),  # restored at 4, 3 new batches: 5, 6, 7
        (State.RUNNING, 6, 0, 0, "timeout"),  # one short, and the deadline has passed
        (State.FAILED, 5, 0, 60, "unhealthy"),
        (State.RUNNING, 9, 120, 60, "unhealthy"),  # stale heartbeat: LOST
    ],
)
def test_the_health_trigger_reports_what_the_store_shows(
    tmp_path: Path, state: State, last_batch: int, age: float, deadline_in: float, expected: str
) -> None:
    jobs, deployment = _deployment(tmp_path, state, last_batch, age)
    trigger = DeploymentHealthTrigger(
        job="orders",
        deployment_id=deployment,
        min_batches=3,
        deadline=time.time() + deadline_in,
        poll_interval=0.05,
        aws_conn_id=None,
        jobs_file=jobs,
    )
    event = _first_event(trigger)
    assert event["status"] == expected, event
    assert event["health"]["target_batch_id"] == 7


def test_the_health_trigger_round_trips_through_serialize(tmp_path: Path) -> None:
    trigger = DeploymentHealthTrigger(
        job="orders",
        deployment_id="dp-1",
        min_batches=2,
        deadline=123.0,
        poll_interval=1.0,
        aws_conn_id="aws_default",
        jobs_file=str(tmp_path / "jobs.toml"),
    )
    path, kwargs = trigger.serialize()
    module, name = path.rsplit(".", 1)
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    json.dumps(kwargs)  # the triggerer stores the kwargs as JSON


def test_the_sensor_defers_while_waiting_and_fails_fast_when_unhealthy(tmp_path: Path) -> None:
    jobs, deployment = _deployment(tmp_path, State.RUNNING, 5)
    sensor = DeploymentHealthSensor(
        task_id="healthy",
        job="orders",
        deployment_id=deployment,
        min_batches=3,
        jobs_file=jobs,
        aws_conn_id=None,
        deferrable=True,
        timeout=30,
    )
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(CONTEXT)
    assert isinstance(deferred.value.trigger, DeploymentHealthTrigger)
    assert sensor.execute_complete(CONTEXT, {"status": "healthy", "message": "ok", "health": {"x": 1}}) == {"x": 1}
    with pytest.raises(AirflowFailException, match="not healthy: deployment dp-1 FAILED"):
        sensor.execute_complete(CONTEXT, {"status": "unhealthy", "message": "deployment dp-1 FAILED (BOOM: )"})

    Deployments(open_storage(str(tmp_path / "store"))).write_status(
        "orders", deployment, DeploymentStatus(State.FAILED, time.time(), error_class="BOOM")
    )
    with pytest.raises(AirflowFailException, match="unhealthy: deployment dp-1 FAILED"):
        sensor.execute(CONTEXT)  # no deferral for something that cannot become healthy


# ---------------------------------------------------------------- bad input


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda j: DeployJobOperator(task_id="t", job="nope", jobs_file=j), "unknown job 'nope'"),
        (lambda j: DeployJobOperator(task_id="t", job="orders", version="v9", jobs_file=j), "no version 'v9'"),
        (
            lambda j: DeployJobOperator(task_id="t", job="orders", restore="sp-20260101T000000000Z-dead", jobs_file=j),
            "sp-20260101T000000000Z-dead",
        ),
        (  # a job with history and no state: the deploy DAG's user is told the form's field, not a CLI flag
            lambda j: DeployJobOperator(task_id="t", job="orders", restore="latest-state", jobs_file=j),
            'no state to take over.*set "Restore from" to none in the DAG\'s trigger form',
        ),
        (  # latest-state is the operator's default too: a fresh start of a job with history is asked for by name
            lambda j: DeployJobOperator(task_id="t", job="orders", jobs_file=j),
            'no state to take over.*set "Restore from" to none in the DAG\'s trigger form',
        ),
        (lambda j: VerifySnapshotOperator(task_id="t", job="orders", snapshot_id="sp-x", jobs_file=j), "sp-x"),
        (lambda j: SavepointOperator(task_id="t", job="orders", jobs_file=j), "no running deployment"),
        (lambda j: SavepointOperator(task_id="t", job="orders", kind="delta", jobs_file=j), "invalid snapshot kind"),
        # the savepoint DAG's label param, as a person types it into the form
        (
            lambda j: SavepointOperator(task_id="t", job="orders", labels="reason=a\nb", jobs_file=j),
            "invalid value of label 'reason': a line break",
        ),
        (
            lambda j: SavepointOperator(task_id="t", job="orders", labels="<script>=x", jobs_file=j),
            "invalid label key",
        ),
        (
            lambda j: SavepointOperator(task_id="t", job="orders", kind="checkpoint", stop=True, jobs_file=j),
            "takes a savepoint, not a checkpoint",
        ),
        (lambda j: StopJobOperator(task_id="t", job="orders", savepoint=True, jobs_file=j), "nothing to stop"),
        (
            lambda j: PreflightCheckOperator(
                task_id="t", job="orders", version="v9", snapshot_id="latest", jobs_file=j
            ),
            "no version 'v9'",
        ),
        (lambda j: RollbackOperator(task_id="t", job="orders", snapshot_id="sp-gone", jobs_file=j), "sp-gone"),
    ],
)
def test_bad_input_fails_the_task_with_a_message_and_changes_nothing(tmp_path: Path, make: Any, message: str) -> None:
    jobs, _ = _deployment(tmp_path, State.STOPPED, 3)
    before = tree(tmp_path)
    operator = make(jobs)
    operator.aws_conn_id = operator.spark_conn_id = None
    context = task_context()
    with pytest.raises(AirflowFailException, match=message) as failure:
        operator.execute(context)
    assert tree(tmp_path) == before
    assert context["ti"].pushed == {"error": str(failure.value)}  # the run's readers (the page, tests) see why


def test_an_unreachable_store_fails_with_a_message_that_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = write_jobs(tmp_path).read_text().replace('store = "store"', 'store = "s3://unreachable-bucket/store"')
    (tmp_path / "jobs.toml").write_text(jobs)
    port = _closed_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    operator = StopJobOperator(task_id="t", job="orders", jobs_file=str(tmp_path / "jobs.toml"), aws_conn_id=None)
    with pytest.raises(Exception, match=f"cannot reach the S3 endpoint.*127.0.0.1:{port}") as failure:
        operator.execute(CONTEXT)
    assert "y" not in str(failure.value).split()  # no secret in the message


def test_a_rollback_to_a_snapshot_that_names_no_version_is_refused(tmp_path: Path) -> None:
    from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
    from airflow_plugin.core.snapshots.store import SnapshotStore
    from tests.support.synthetic import write_checkpoint

    jobs, _ = _deployment(tmp_path, State.STOPPED, 3)
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    manual = create_snapshot(store, open_storage(str(write_checkpoint(tmp_path / "ck", 3))), SnapshotRequest("orders"))
    before = tree(tmp_path)
    operator = RollbackOperator(task_id="t", job="orders", snapshot_id=manual.id, jobs_file=jobs)
    operator.aws_conn_id = operator.spark_conn_id = None
    with pytest.raises(AirflowFailException, match=f"snapshot {manual.id} of job orders does not record the version"):
        operator.execute(CONTEXT)
    assert tree(tmp_path) == before


def test_release_lease_ends_the_runs_kept_lease_and_leaves_anyone_elses(tmp_path: Path) -> None:
    """A DAG whose tasks keep the job's lease ends with ReleaseLeaseOperator: the run's lease is released (the
    next operation takes it as released), another holder's is left alone."""
    jobs, _ = _deployment(tmp_path, State.STOPPED, 3)
    storage = open_storage(str(tmp_path / "store"))
    operator = ReleaseLeaseOperator(task_id="release", job="orders", jobs_file=jobs)
    operator.aws_conn_id = operator.spark_conn_id = None
    acquire(storage, "orders", "bob@host:1", "stop", ttl=60).keep()
    assert operator.execute(task_context())["released"] is False
    assert read_lease(storage, "orders").holder == "bob@host:1"
    break_lease(storage, "orders")
    acquire(storage, "orders", airflow_holder("test_dag", "manual"), "deploy", ttl=60).keep()
    assert operator.execute(task_context()) == {"job": "orders", "holder": "airflow:test_dag/manual", "released": True}
    assert read_lease(storage, "orders") is None
    assert acquire(storage, "orders", "carol@host:2", "stop", ttl=60).record.holder == "carol@host:2"
    assert operator.execute(task_context())["released"] is False  # carol's


def test_operators_sensors_triggers_and_hooks_are_importable_where_users_look() -> None:
    """`from airflow_plugin.operators import SavepointOperator`, as from any provider; a new operator that is
    not exported fails here."""
    import importlib
    import inspect
    import pkgutil

    from airflow.sdk import BaseHook, BaseOperator
    from airflow.triggers.base import BaseTrigger

    for package, base in (
        ("airflow_plugin.operators", BaseOperator),
        ("airflow_plugin.sensors", BaseOperator),
        ("airflow_plugin.triggers", BaseTrigger),
        ("airflow_plugin.hooks", BaseHook),
    ):
        exported = importlib.import_module(package)
        defined = set()
        for module in pkgutil.iter_modules(exported.__path__):
            found = importlib.import_module(f"{package}.{module.name}")
            defined |= {
                name
                for name, cls in inspect.getmembers(found, inspect.isclass)
                if issubclass(cls, base) and cls.__module__ == found.__name__
            }
        assert defined and defined <= set(exported.__all__), (package, defined - set(exported.__all__))
        assert all(getattr(exported, name) for name in exported.__all__)
    from airflow_plugin.operators import DeployJobOperator, SavepointOperator  # the issue's own example

    assert SavepointOperator.__name__ == "SavepointOperator" and DeployJobOperator.template_fields


# ---------------------------------------------------------------- Airflow's metrics


def test_the_operators_figures_reach_airflows_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each name stats.py documents, with its tags, sent by the task that owns it (the engine calls are stood in
    for: what is checked is what reaches Airflow's Stats); timers only for work that succeeded."""
    from airflow_plugin import stats
    from airflow_plugin.core.upgrades.record import Phase
    from airflow_plugin.operators import deployments, snapshots, upgrade

    sent: list[tuple[str, str, dict[str, str]]] = []
    recorder = SimpleNamespace(
        timing=lambda name, dt, tags: sent.append(("timing", name, tags)),
        incr=lambda name, tags: sent.append(("incr", name, tags)),
    )
    monkeypatch.setattr(stats, "Stats", recorder)
    jobs, _ = _deployment(tmp_path, State.STOPPED, 3)
    common: dict[str, Any] = {"task_id": "t", "job": "orders", "jobs_file": jobs, "aws_conn_id": None}

    with pytest.raises(AirflowFailException, match="no state to take over"):  # history, no state: refused
        DeployJobOperator(restore="latest-state", spark_conn_id=None, **common).execute(task_context())
    assert sent == [("incr", "savepoints.refused", {"job": "orders", "reason": "NoState"})]

    sent.clear()
    restored = Deployment(id="dp-2", job="orders", version="v1", checkpoint="c", restored_from="sp-1")
    monkeypatch.setattr(deployments, "deploy", lambda ctx, request: restored)
    monkeypatch.setattr(deployments, "deployment_xcom", lambda ctx, deployment: {})
    DeployJobOperator(restore="sp-1", spark_conn_id=None, **common).execute(task_context())
    monkeypatch.setattr(snapshots, "take_savepoint", lambda ctx, **kw: SimpleNamespace(files=[], **dict.fromkeys(
        ("kind", "id", "batch_id", "total_bytes", "uploaded_bytes"), 0)))  # fmt: skip
    monkeypatch.setattr(snapshots, "emit_snapshot_event", lambda *a: None)
    monkeypatch.setattr(snapshots, "snapshot_xcom", lambda *a: {})
    SavepointOperator(**common).execute(task_context())
    record = SimpleNamespace(phase=Phase.CUTTING_OVER, to_dict=dict)
    monkeypatch.setattr(upgrade, "Upgrades", lambda storage: SimpleNamespace(get=lambda job, upgrade_id: record))
    monkeypatch.setattr(upgrade, "advance", lambda ctx, u: SimpleNamespace(phase=Phase.RETIRING, to_dict=dict))
    upgrade.UpgradeStepOperator(upgrade_id="up-1", phases=["CUTTING_OVER"], **common).execute(task_context())
    assert [(kind, name, tags) for kind, name, tags in sent] == [
        ("timing", "savepoints.restore.duration", {"job": "orders"}),
        ("timing", "savepoints.snapshot.duration", {"job": "orders", "kind": "savepoint"}),
        ("timing", "savepoints.cutover.duration", {"job": "orders"}),
    ]


def test_an_upgrade_that_waits_defers_and_its_trigger_fires_when_a_step_can_go_on(tmp_path: Path) -> None:
    """A blue/green upgrade whose green has not committed its batches yet: the wait task advances it once, finds
    it waiting (core/upgrades/steps.py `waiting`) and defers to UpgradeTrigger instead of holding a worker slot; the
    trigger fires once green is healthy and caught up. The wait keeps the run's lease and Kafka connection as told."""
    from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
    from airflow_plugin.sensors.upgrade import UpgradeWaitSensor
    from airflow_plugin.triggers.upgrade import UpgradeTrigger

    jobs = str(write_jobs(tmp_path))
    storage = open_storage(str(tmp_path / "store"))
    records = Deployments(storage)
    now = time.time()
    watermark = "2026-01-01T00:10:00Z"
    for deployment_id, batch in (("dp-old", 40), ("dp-new", 5)):
        records.put(Deployment(deployment_id, "orders", "v1", str(tmp_path / deployment_id), restored_batch_id=5))
        status = DeploymentStatus(State.RUNNING, now, last_batch_id=batch, watermark=watermark)
        records.write_status("orders", deployment_id, status)
    upgrade = Upgrade("up-1", "orders", "v2", mode="blue_green", old_deployment="dp-old", new_deployment="dp-new")
    upgrade.settings = {"min_batches": 2, "lag_must_fall": False}
    upgrade.deadline = now + 600
    Upgrades(storage).put(upgrade.move(Phase.CATCHING_UP, "green started"))

    sensor = UpgradeWaitSensor(
        task_id="catch_up",
        job="orders",
        upgrade_id="up-1",
        phases=["CATCHING_UP"],
        jobs_file=jobs,
        aws_conn_id=None,
        spark_conn_id=None,
        kafka_conn_id="my_kafka",
        keep_lease=True,
    )
    assert sensor.keep_lease and sensor.hook.kafka_conn_id == "my_kafka"
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(task_context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, UpgradeTrigger) and (trigger.upgrade_id, trigger.phase) == ("up-1", "CATCHING_UP")
    name, kwargs = trigger.serialize()
    again = UpgradeTrigger(**kwargs)
    assert name == "airflow_plugin.triggers.upgrade.UpgradeTrigger" and again.serialize() == (name, kwargs)

    hook = SavepointsHook(aws_conn_id=None, spark_conn_id=None, jobs_file=jobs, kafka_conn_id=None)
    event, seen = trigger.check(hook)
    assert event is None and "green catching up" in seen["message"]
    records.write_status(
        "orders", "dp-new", DeploymentStatus(State.RUNNING, time.time(), last_batch_id=7, watermark=watermark)
    )
    event, _ = trigger.check(hook)
    assert event is not None and (event["status"], event["upgrade"]) == ("ready", "up-1")
    assert Upgrades(storage).get("orders", "up-1").phase is Phase.CATCHING_UP, "the trigger only looks"


def test_an_upgrade_nobody_approves_in_time_is_aborted_and_lets_the_job_go(tmp_path: Path) -> None:
    """`UpgradeJobOperator(approve=True)`: the approval request timed out (Airflow resumes the task with a timeout
    event, from the triggerer or the scheduler's sweep): the upgrade is aborted before anything was launched, says
    why, and its lease is released; the task fails without a retry. (An answer, Approve or Reject, through Airflow's
    own API: tests/airflow/test_dags.py.)"""
    from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
    from airflow_plugin.operators import UpgradeJobOperator

    jobs = str(write_jobs(tmp_path))
    storage = open_storage(str(tmp_path / "store"))
    upgrade = Upgrade("up-1", "orders", "v2", mode="stop_restore", request_id="airflow:test_dag/manual/test_task/-1")
    Upgrades(storage).put(upgrade.move(Phase.LAUNCHING, "pre-flight passed"))
    acquire(storage, "orders", upgrade_holder(upgrade.id, RUN), "upgrade", LEASE_SECONDS).keep()  # the task's run
    operator = UpgradeJobOperator(
        task_id="test_task",
        job="orders",
        version="v2",
        approve=True,
        jobs_file=jobs,
        aws_conn_id=None,
        spark_conn_id=None,
    )
    timeout = {
        "error": "The Human-in-the-loop response timeout has passed without a response.",
        "error_type": "timeout",
    }
    context = task_context()
    with pytest.raises(AirflowFailException, match="ABORTED: not approved"):
        operator.execute_complete(context, timeout)
    record = Upgrades(storage).get("orders", "up-1")
    assert record.phase is Phase.ABORTED and record.new_deployment is None and record.approved_by is None
    assert record.error is not None and "timeout has passed without a response" in record.error, record.error
    assert context["ti"].pushed["upgrade"]["phase"] == "ABORTED"
    assert read_lease(storage, "orders") is None, "the job is free again"


def test_the_apply_operator_waits_for_its_upgrade_in_the_triggerer_and_records_how_it_ended(tmp_path: Path) -> None:
    """The loop's upgrade (blue/green, green catching up) waits in Airflow's triggerer: the apply task defers to the
    upgrade's trigger instead of holding a worker. Resumed after the upgrade ended (here: aborted meanwhile), it
    records the version as failed under this declaration and fails, saying it is held."""
    jobs = write_jobs(tmp_path, extra='desired = { version = "v2" }')
    storage = open_storage(str(tmp_path / "store"))
    records_ = Deployments(storage)
    old = Deployment("dp-20261128T000000000Z-0001", "orders", "v1", str(tmp_path / "c1"))
    new = Deployment("dp-20261128T000000000Z-0002", "orders", "v2", str(tmp_path / "c2"), restored_batch_id=9)
    for deployment, batch in ((old, 12), (new, 9)):
        records_.put(deployment)
        records_.write_status(
            "orders", deployment.id, DeploymentStatus(State.RUNNING, time.time(), last_batch_id=batch)
        )
    upgrade = Upgrade(
        id=new_upgrade_id(),
        job="orders",
        to_version="v2",
        mode="blue_green",
        requested_by=f"{APPLY} (scheduler)",
        old_deployment=old.id,
        old_version="v1",
        new_deployment=new.id,
        settings=asdict(UpgradeSettings()),
        deadline=time.time() + 600,
    ).move(Phase.CATCHING_UP, "green started beside blue")
    Upgrades(storage).put(upgrade)
    acquire(storage, "orders", upgrade_holder(upgrade.id, RUN), "upgrade", LEASE_SECONDS).keep()  # this run's
    operator = ApplyJobOperator(task_id="apply", job="orders", jobs_file=str(jobs))
    operator.aws_conn_id = operator.spark_conn_id = None

    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(task_context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, UpgradeTrigger) and trigger.upgrade_id == upgrade.id, trigger
    assert deferred.value.method_name == "execute_complete"

    ended = Upgrades(storage).get("orders", upgrade.id).move(Phase.ABORTED, "aborted by a person")
    ended.error = "aborted by a person"
    Upgrades(storage).put(ended)
    break_lease(storage, "orders")  # an ended upgrade has let the job go
    with pytest.raises(UpgradeFailed, match=r"ended ABORTED: aborted by a person; v2 is held until the jobs file"):
        operator.execute_complete(task_context(), {"upgrade": upgrade.id, "status": "changed"})
    kept = reconcile_records.read(storage, "orders")
    assert "v2" in kept.failed_versions and kept.last_step is not None and "ABORTED" in kept.last_step, kept


def test_a_deferred_upgrade_is_driven_by_its_own_task_alone(tmp_path: Path) -> None:
    """Issue 51 (5): the loop's upgrade waits in the triggerer (ApplyJobOperator deferred, the DAG run's lease kept for
    its next look). `savepoints apply` and `savepoints upgrade --resume` from a shell beside it are refused, naming the
    run, and do not advance it (before, they took the lease as "a later step" and drove it from a second copy of its
    record); the task resumed after its trigger fired goes on at once, as the same driver."""
    jobs = write_jobs(tmp_path, extra='desired = { version = "v2" }')
    storage = open_storage(str(tmp_path / "store"))
    old = Deployment("dp-20261128T000000000Z-0001", "orders", "v1", str(tmp_path / "c1"))
    new = Deployment("dp-20261128T000000000Z-0002", "orders", "v2", str(tmp_path / "c2"), restored_batch_id=9)

    def beat() -> None:  # fresh heartbeats: green has committed no batch of its own yet
        for deployment, batch in ((old, 12), (new, 9)):
            status = DeploymentStatus(State.RUNNING, time.time(), last_batch_id=batch)
            Deployments(storage).write_status("orders", deployment.id, status)

    for deployment in (old, new):
        Deployments(storage).put(deployment)
    beat()
    upgrade = Upgrade(
        id=new_upgrade_id(),
        job="orders",
        to_version="v2",
        mode="blue_green",
        requested_by=f"{APPLY} (scheduler)",
        old_deployment=old.id,
        old_version="v1",
        new_deployment=new.id,
        settings=asdict(UpgradeSettings()),
        deadline=time.time() + 600,
    ).move(Phase.CATCHING_UP, "green started beside blue")
    Upgrades(storage).put(upgrade)
    operator = ApplyJobOperator(task_id="apply", job="orders", jobs_file=str(jobs))
    operator.aws_conn_id = operator.spark_conn_id = None
    with pytest.raises(TaskDeferred):
        operator.execute(task_context())
    held = read_lease(storage, "orders")
    assert held is not None and held.holder == upgrade_holder(upgrade.id, RUN) and not held.expired()
    key = f"jobs/orders/upgrades/{upgrade.id}.json"
    before = storage.read_with_token(key)

    for command in (["apply", "orders"], ["upgrade", "orders", "--resume"]):
        shell = subprocess.run(
            [sys.executable, "-m", "airflow_plugin", *command, "--jobs", str(jobs)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shell.returncode == 4, (command, shell.stdout[-2000:], shell.stderr[-2000:])
        assert f"job orders is busy: {held.holder} for upgrade" in shell.stdout + shell.stderr, shell.stderr[-2000:]
    assert storage.read_with_token(key) == before, "neither advanced it"
    assert read_lease(storage, "orders") == held

    beat()
    with pytest.raises(TaskDeferred):  # its trigger fired: the task looks again, and waits again
        operator.execute_complete(task_context(), {"upgrade": upgrade.id, "status": "ready"})
    again = read_lease(storage, "orders")
    assert again is not None and again.holder == held.holder and again.token != held.token, "taken back at once"
    assert storage.read_with_token(key)[1] != before[1], "and it wrote the record"
