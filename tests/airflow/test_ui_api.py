"""The savepoints page's API, through FastAPI's TestClient against Airflow's real app, auth manager and
metadata DB, and a real snapshot store written by the engine: who may do what (anonymous 401, viewer
403, admin 200, a cross-site form post with only the cookie 403), what the page shows (hundreds of
snapshots paged, the empty state, store errors as clear messages) and what its actions do (a real run of
the savepoint DAG in Airflow's history; pins in the manifests; restore commands that run as printed)."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_plugin.core.records.deployment import State
from airflow_plugin.core.records.manifest import Kind
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
from airflow_plugin.ui.app import create_app
from airflow_plugin.ui.security import DEPLOY_DAG_ID, PAGE_HEADER, SAVEPOINT_DAG_ID, UPGRADE_DAG_ID
from airflow_plugin.ui.views import PAGE_SIZE, PageSettings
from devtools.kafka import EmbeddedKafka
from tests.support.synthetic import add_batch, kafka_offsets, tree, write_checkpoint
from tests.support.ui_support import bearer, recorded_deployment, serialize_dags, token

SNAPSHOTS = 200  # "hundreds": four pages of 50
CHECKPOINT_EVERY = 4  # every 4th snapshot is of kind checkpoint


def jobs_toml(store: Path | str, checkpoint_root: Path, jobs: tuple[str, ...]) -> str:
    body = f'[defaults]\nstore = "{store}"\ncheckpoint_root = "{checkpoint_root}"\n'
    for job in jobs:
        body += f'\n[jobs.{job}]\ndescription = "the {job} job"\nversions.v1 = {{ application = "job.py" }}\n'
        body += 'versions.v2 = { application = "job.py" }\n'
    return body


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, airflow_app: FastAPI) -> Iterator[dict[str, Any]]:
    """A local store with SNAPSHOTS real snapshots of job `orders` (batches advancing) and none of `quiet`;
    the jobs file declaring both; the savepoint DAG serialized with that jobs file."""
    root = tmp_path_factory.mktemp("ui")
    store_dir, checkpoint = root / "store", write_checkpoint(root / "ckpt", batches=2)
    jobs_file = root / "jobs.toml"
    jobs_file.write_text(jobs_toml(store_dir, root / "checkpoints", ("orders", "quiet")))
    store, source = SnapshotStore(open_storage(str(store_dir))), open_storage(str(checkpoint))
    ids = []
    for i in range(SNAPSHOTS):
        if i % 10 == 0:
            add_batch(checkpoint, 2 + i // 10)
        kind = Kind.CHECKPOINT if i % CHECKPOINT_EVERY == 0 else Kind.SAVEPOINT
        request = SnapshotRequest(job="orders", kind=kind, job_version="v1", labels={"n": str(i)})
        ids.append(create_snapshot(store, source, request).id)
    serialize_dags(jobs_file)
    yield {"root": root, "jobs_file": jobs_file, "store": store, "ids": ids, "store_dir": store_dir}
    delete_savepoint_runs(("orders", "quiet"))  # queued, never run: leave the shared metadata DB as it was


@pytest.fixture(scope="module")
def client(world: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(create_app(PageSettings(jobs_file=str(world["jobs_file"])))) as c:
        yield c


@pytest.fixture(scope="module")
def mounted(airflow_app: FastAPI) -> Iterator[TestClient]:
    """The page as the plugin mounts it in Airflow's API server (the project's jobs file)."""
    with TestClient(airflow_app) as c:
        yield c


ADMIN = ("admin", "admin")
VIEWER = ("viewer", "viewer")
USER = ("ops", "user")  # SimpleAuthManager's USER role may trigger DAGs


def savepoint_runs(job: str) -> list[Any]:
    from airflow.models import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == SAVEPOINT_DAG_ID)).all()
        session.expunge_all()
    return [run for run in runs if (run.conf or {}).get("job") == job]


def audit_events(event: str) -> list[tuple[str, str]]:
    """(owner, method) of Airflow's audit log entries for `event`, oldest first."""
    from airflow.models import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(Log).where(Log.event == event).order_by(Log.id)).all()
        return [(row.owner, json.loads(row.extra)["method"]) for row in rows]


def delete_savepoint_runs(jobs: tuple[str, ...]) -> None:
    """The runs of the savepoint, upgrade and deploy DAGs the page triggered for these jobs."""
    from airflow.models import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dags = (SAVEPOINT_DAG_ID, UPGRADE_DAG_ID, DEPLOY_DAG_ID)
    with create_session() as session:
        for run in session.scalars(select(DagRun).where(DagRun.dag_id.in_(dags))):
            if (run.conf or {}).get("job") in jobs:
                session.delete(run)


# --- authentication and authorization ----------------------------------------------------------------

ENDPOINTS = [
    ("GET", "/api/me", None),
    ("GET", "/api/jobs", None),
    ("GET", "/api/jobs/orders/deployments", None),
    ("GET", "/api/jobs/orders/snapshots", None),
    ("GET", "/api/jobs/orders/runs", None),
    ("GET", "/static/savepoints.js", None),
    ("POST", "/api/jobs/orders/savepoints", {}),
    ("GET", "/api/jobs/orders/upgrades", None),
    ("POST", "/api/jobs/orders/upgrades", {"version": "v2"}),
    ("POST", "/api/jobs/orders/deployments", {"version": "v1"}),
    ("GET", "/api/jobs/orders/deploy-runs", None),
    ("GET", "/api/fleet", None),
    ("PUT", "/api/jobs/orders/snapshots/latest/pin", {"pinned": True}),
    ("GET", "/metrics", None),
]


def test_the_job_list_gives_versions_in_natural_order(tmp_path: Path) -> None:
    """The page's upgrade menu lists what the job list says: v2 before v10 (issue 45)."""
    from types import SimpleNamespace

    from airflow_plugin.core.jobs.spec import load_jobs
    from airflow_plugin.ui.views import job_list

    versions = "".join(f'versions.{v} = {{ application = "job.py" }}\n' for v in ("v10", "v2", "v1"))
    (tmp_path / "jobs.toml").write_text(f'[jobs.orders]\ncheckpoint_root = "c"\n{versions}')
    context = SimpleNamespace(jobs=load_jobs(str(tmp_path / "jobs.toml")), store_uri=lambda name: "store")
    [listed] = job_list(SimpleNamespace(context=context, jobs_file="jobs.toml"))["jobs"]  # type: ignore[arg-type]
    assert listed["versions"] == ["v1", "v2", "v10"] and listed["default_version"] == "v1"


def test_the_plugin_serves_the_page_in_airflow_and_refuses_anonymous_callers(mounted: TestClient) -> None:
    for method, path, body in ENDPOINTS:
        response = mounted.request(method, "/savepoints" + path, json=body, headers={PAGE_HEADER: "1"})
        assert response.status_code == 401, (method, path, response.text)
    page = mounted.get("/savepoints/", follow_redirects=False)
    assert page.status_code == 307 and page.headers["location"].startswith("/auth/login?next=")

    admin = bearer(*ADMIN)
    page = mounted.get("/savepoints/", headers=admin)
    assert page.status_code == 200 and "Take savepoint" in page.text and "static/savepoints.js" in page.text
    assert page.headers["content-security-policy"] == "frame-ancestors 'self'"
    assert mounted.get("/savepoints/static/savepoints.js", headers=admin).status_code == 200
    assert mounted.get("/savepoints/api/me", headers=admin).json()["user"] == "admin"
    # the page's entry in Airflow's navigation
    plugins = mounted.get("/api/v2/plugins", headers=admin).json()["plugins"]
    plugin = next(p for p in plugins if p["name"] == "savepoints")
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/savepoints"
    view = plugin["external_views"][0]
    assert (view["name"], view["destination"], view["href"]) == ("Savepoints", "nav", "savepoints/")


def test_the_ui_cookie_authenticates_like_a_bearer_token(client: TestClient) -> None:
    client.cookies.set("_token", token(*VIEWER))
    try:
        assert client.get("/api/me").json() == {
            "user": "viewer",
            "can": {
                "trigger": False,
                "pin": False,
                "read_runs": True,
                "upgrade": False,
                "deploy": False,
                "read_deploy_runs": True,
            },
        }
    finally:
        client.cookies.clear()


def test_a_viewer_reads_everything_but_may_not_trigger_or_pin(client: TestClient, world: dict[str, Any]) -> None:
    viewer = bearer(*VIEWER)
    for path in ("/api/jobs", "/api/jobs/orders/deployments", "/api/jobs/orders/snapshots", "/api/jobs/orders/runs"):
        assert client.get(path, headers=viewer).status_code == 200, path
    before = len(savepoint_runs("orders"))
    newest = world["ids"][-1]

    refused = client.post("/api/jobs/orders/savepoints", json={}, headers=viewer)
    assert refused.status_code == 403, refused.text
    refused = client.put(f"/api/jobs/orders/snapshots/{newest}/pin", json={"pinned": True}, headers=viewer)
    assert refused.status_code == 403, refused.text

    assert len(savepoint_runs("orders")) == before
    assert world["store"].get("orders", newest).pinned is False

    # Prometheus' scrape with a viewer's token: OpenMetrics, the figures of `savepoints metrics`
    scraped = client.get("/metrics", headers=viewer)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("application/openmetrics-text")
    newest_savepoint = world["store"].latest("orders", kind=Kind.SAVEPOINT)
    wanted = f'savepoints_last_snapshot_batch{{job="orders",kind="savepoint"}} {float(newest_savepoint.batch_id)}'
    assert wanted in scraped.text.splitlines(), scraped.text[:2000]


def test_an_admin_triggers_a_run_of_the_savepoint_dag_that_airflow_records(client: TestClient) -> None:
    response = client.post(
        "/api/jobs/orders/savepoints",
        json={"stop": False, "pin": True, "label": "reason=ui-test"},
        headers=bearer(*ADMIN),
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["dag_id"] == SAVEPOINT_DAG_ID and body["state"] == "queued" and body["dag_paused"] is False

    run = next(r for r in savepoint_runs("orders") if r.run_id == body["run_id"])
    assert run.conf == {"job": "orders", "stop": False, "pin": True, "label": "reason=ui-test", "trigger": "UI"}
    assert run.triggering_user_name == "admin" and str(run.run_type) in ("manual", "DagRunType.MANUAL")
    assert run.state == "queued"
    assert audit_events("savepoints_page_trigger")[-1] == ("admin", "POST")
    listed = client.get("/api/jobs/orders/runs", headers=bearer(*VIEWER)).json()["runs"]
    assert listed[0]["run_id"] == body["run_id"] and listed[0]["triggering_user"] == "admin"
    assert client.get("/api/jobs/quiet/runs", headers=bearer(*VIEWER)).json()["runs"] == []


def test_the_user_role_may_trigger_and_the_dag_validates_what_it_is_given(client: TestClient) -> None:
    ops = bearer(*USER)
    assert client.post("/api/jobs/quiet/savepoints", json={}, headers=ops).status_code == 201
    assert [r.triggering_user_name for r in savepoint_runs("quiet")] == ["ops"]

    bad_label = client.post("/api/jobs/quiet/savepoints", json={"label": "no equals sign"}, headers=ops)
    assert bad_label.status_code == 400 and "label" in bad_label.json()["error"], bad_label.text
    unknown = client.post("/api/jobs/nope/savepoints", json={}, headers=ops)
    assert unknown.status_code == 404
    assert unknown.json()["error"].startswith("unknown job 'nope'") and "orders, quiet" in unknown.json()["error"]
    assert len(savepoint_runs("quiet")) == 1


def test_an_upgrade_is_triggered_from_the_page_and_its_progress_read_back(
    client: TestClient, world: dict[str, Any]
) -> None:
    from airflow.models import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    admin, viewer = bearer(*ADMIN), bearer(*VIEWER)
    assert client.get("/api/me", headers=viewer).json()["can"]["upgrade"] is False
    assert client.get("/api/me", headers=admin).json()["can"]["upgrade"] is True
    assert client.get("/api/jobs/orders/upgrades", headers=viewer).json()["newest"] is None
    refused = client.post("/api/jobs/orders/upgrades", json={"version": "v2"}, headers=viewer)
    assert refused.status_code == 403, refused.text
    unknown = client.post("/api/jobs/orders/upgrades", json={"version": "v9"}, headers=admin)
    assert unknown.status_code == 404 and "has no version 'v9': declared versions are v1, v2" in unknown.json()["error"]
    sideways = client.post("/api/jobs/orders/upgrades", json={"version": "v2", "mode": "sideways"}, headers=admin)
    assert sideways.status_code == 422

    response = client.post("/api/jobs/orders/upgrades", json={"version": "v2", "mode": "blue_green"}, headers=admin)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["dag_id"] == UPGRADE_DAG_ID and body["state"] == "queued"
    with create_session() as session:
        run = session.scalars(select(DagRun).where(DagRun.run_id == body["run_id"])).one()
        assert run.conf == {"job": "orders", "version": "v2", "mode": "blue_green"}  # the form's defaults for the rest
        assert run.triggering_user_name == "admin"
    assert audit_events("savepoints_page_upgrade")[-1] == ("admin", "POST")

    # what the DAG's tasks write as the upgrade goes on, read back for the page
    upgrade = Upgrade(id="up-20261124T000000000Z-0001", job="orders", to_version="v2", mode="blue_green")
    upgrade.move(Phase.CATCHING_UP, "green started from sp-1, staging")
    Upgrades(world["store"].storage).put(upgrade)
    newest = client.get("/api/jobs/orders/upgrades", headers=viewer).json()["newest"]
    assert (newest["phase"], newest["ended"], newest["note"]) == (
        "CATCHING_UP",
        False,
        "green started from sp-1, staging",
    )
    upgrade.move(Phase.ABORTED, "green unhealthy")
    upgrade.error = "green is unhealthy: FAILED"
    Upgrades(world["store"].storage).put(upgrade)
    newest = client.get("/api/jobs/orders/upgrades", headers=viewer).json()["newest"]
    assert newest["ended"] and not newest["succeeded"] and newest["error"] == "green is unhealthy: FAILED"


def dag_runs(dag_id: str, job: str) -> list[Any]:
    from airflow.models import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)).all()
        session.expunge_all()
    return [run for run in runs if (run.conf or {}).get("job") == job]


def test_a_job_that_never_ran_is_deployed_from_the_page(client: TestClient) -> None:
    """A person who lives in the UI starts a job from its page: the deploy DAG, with the job, the version and where
    its state comes from, triggered by them as Airflow's REST API would, and followed through the job's deploy runs."""
    admin, viewer = bearer(*ADMIN), bearer(*VIEWER)
    assert client.get("/api/me", headers=admin).json()["can"]["deploy"] is True
    assert client.get("/api/me", headers=viewer).json()["can"]["deploy"] is False
    offered = client.get("/api/jobs/quiet/deployments", headers=viewer).json()["deploy"]
    assert offered == {"possible": True, "reason": ""}  # nothing of it runs: the page's Deploy is enabled

    refused = client.post("/api/jobs/quiet/deployments", json={"version": "v2"}, headers=viewer)
    assert refused.status_code == 403, refused.text
    unknown = client.post("/api/jobs/quiet/deployments", json={"version": "v9"}, headers=admin)
    assert unknown.status_code == 404 and "has no version 'v9'" in unknown.json()["error"], unknown.text
    absent = "sp-20000101T000000000Z-0000"
    missing = client.post("/api/jobs/quiet/deployments", json={"version": "v1", "restore": absent}, headers=admin)
    assert missing.status_code == 404 and "has no snapshots" in missing.json()["error"], missing.text  # the engine's
    assert client.post("/api/jobs/nope/deployments", json={"version": "v1"}, headers=admin).status_code == 404
    assert dag_runs(DEPLOY_DAG_ID, "quiet") == []

    response = client.post("/api/jobs/quiet/deployments", json={"version": "v2"}, headers=admin)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["dag_id"] == DEPLOY_DAG_ID and body["state"] == "queued" and body["version"] == "v2"
    [run] = dag_runs(DEPLOY_DAG_ID, "quiet")
    assert run.run_id == body["run_id"] and run.triggering_user_name == "admin"
    assert run.conf == {"job": "quiet", "version": "v2", "restore": "latest-state"}  # the form's defaults for the rest
    assert audit_events("savepoints_page_deploy")[-1] == ("admin", "POST")
    listed = client.get("/api/jobs/quiet/deploy-runs", headers=viewer).json()["runs"]
    assert [(r["run_id"], r["version"], r["state"]) for r in listed] == [(body["run_id"], "v2", "queued")]


def test_a_deployment_not_running_yet_offers_no_savepoint_and_one_running_no_deploy(
    airflow_app: FastAPI, tmp_path: Path
) -> None:
    """A STARTING deployment has no batch to snapshot: "Take savepoint" is disabled with why, as "Upgrade" is; and
    while a deployment is live, the job cannot be deployed again: the engine's reason, and no run is triggered."""
    store = str(tmp_path / "store")
    jobs_file = tmp_path / "jobs.toml"
    jobs_file.write_text(
        jobs_toml(store, tmp_path / "checkpoints", ("starting", "running")).replace(
            "[defaults]\n", "[defaults]\nheartbeat_timeout = 3600\n"
        )
    )
    starting = recorded_deployment(store, "starting", State.STARTING, tmp_path / "checkpoints")
    running = recorded_deployment(store, "running", State.RUNNING, tmp_path / "checkpoints")
    admin = bearer(*ADMIN)
    with TestClient(create_app(PageSettings(jobs_file=str(jobs_file)))) as page:
        now = page.get("/api/jobs/starting/deployments", headers=admin).json()
        assert [d["state"] for d in now["deployments"]] == ["STARTING"]
        assert now["savepoint"]["possible"] is False and now["savepoint"]["deployment"] == starting.id
        assert f"deployment {starting.id} is STARTING" in now["savepoint"]["reason"], now["savepoint"]
        assert now["deploy"]["possible"] is False and "in state STARTING" in now["deploy"]["reason"], now["deploy"]

        now = page.get("/api/jobs/running/deployments", headers=admin).json()
        assert now["savepoint"] == {"possible": True, "deployment": running.id, "reason": ""}
        assert now["deploy"]["possible"] is False
        assert f"already has deployment {running.id} in state RUNNING" in now["deploy"]["reason"], now["deploy"]
        again = page.post("/api/jobs/running/deployments", json={"version": "v1"}, headers=admin)
        assert again.status_code == 409 and again.json()["error"] == now["deploy"]["reason"], again.text
        # "all healthy" where something runs and all of it is healthy (the one starting is neither)
        assert page.get("/api/fleet", headers=admin).json()["summary"]["text"] == "1 running, all healthy · 1 starting"
    assert dag_runs(DEPLOY_DAG_ID, "running") == []


def test_a_cross_site_form_post_carrying_only_the_cookie_triggers_nothing(client: TestClient) -> None:
    """What a malicious page can make a logged-in admin's browser send: a form post with the cookie."""
    before = len(savepoint_runs("quiet"))
    client.cookies.set("_token", token(*ADMIN))
    try:
        form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": "https://evil.example"}
        for headers in ({**form, "Sec-Fetch-Site": "cross-site"}, form):  # with and without fetch metadata
            refused = client.post("/api/jobs/quiet/savepoints", content="stop=true", headers=headers)
            assert refused.status_code == 403, refused.text
            assert PAGE_HEADER in refused.json()["detail"] or "cross-site" in refused.json()["detail"]
        pin_form = {**form, "Sec-Fetch-Site": "cross-site"}
        refused = client.put("/api/jobs/orders/snapshots/latest/pin", content="pinned=true", headers=pin_form)
        assert refused.status_code == 403
        # even a request that sets the page's header is refused when the browser says it is cross-site
        refused = client.post(
            "/api/jobs/quiet/savepoints", json={}, headers={PAGE_HEADER: "1", "Sec-Fetch-Site": "cross-site"}
        )
        assert refused.status_code == 403
        assert len(savepoint_runs("quiet")) == before

        # the page itself (same origin, its header) works with the same cookie
        accepted = client.post(
            "/api/jobs/quiet/savepoints", json={}, headers={PAGE_HEADER: "1", "Sec-Fetch-Site": "same-origin"}
        )
        assert accepted.status_code == 201, accepted.text
        assert len(savepoint_runs("quiet")) == before + 1
    finally:
        client.cookies.clear()


def test_pin_and_unpin_write_the_manifest(client: TestClient, world: dict[str, Any]) -> None:
    target = world["ids"][-3]
    admin = bearer(*ADMIN)
    pinned = client.put(f"/api/jobs/orders/snapshots/{target}/pin", json={"pinned": True}, headers=admin)
    assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    assert world["store"].get("orders", target).pinned is True
    unpinned = client.put(f"/api/jobs/orders/snapshots/{target}/pin", json={"pinned": False}, headers=admin)
    assert unpinned.status_code == 200 and unpinned.json()["pinned"] is False
    assert world["store"].get("orders", target).pinned is False
    assert audit_events("savepoints_page_pin")[-2:] == [("admin", "PUT"), ("admin", "PUT")]

    absent = "sp-20000101T000000000Z-0000"
    missing = client.put(f"/api/jobs/orders/snapshots/{absent}/pin", json={"pinned": True}, headers=admin)
    assert missing.status_code == 404 and "does not exist" in missing.json()["error"]


# --- what the page shows -----------------------------------------------------------------------------


def test_hundreds_of_snapshots_come_in_pages_newest_first(client: TestClient, world: dict[str, Any]) -> None:
    viewer, ids = bearer(*VIEWER), world["ids"]
    first = client.get("/api/jobs/orders/snapshots", headers=viewer).json()
    assert first["total"] == SNAPSHOTS and first["limit"] == PAGE_SIZE and first["offset"] == 0
    assert [s["id"] for s in first["snapshots"]] == ids[::-1][:PAGE_SIZE]
    assert len(first["timeline"]) == SNAPSHOTS  # the chart gets every snapshot, compactly
    assert set(first["timeline"][0]) == {
        "id",
        "kind",
        "status",
        "batch_id",
        "created_at",
        "pinned",
        "deployment",
        "state",
    }
    row = first["snapshots"][0]
    columns = ("id", "kind", "trigger", "status", "batch_id", "bytes", "uploaded_bytes", "age_s", "pinned", "verified")
    assert set(columns) <= set(row)
    assert row["batch_id"] == 2 + (SNAPSHOTS - 1) // 10  # the newest committed batch when it was taken

    last = client.get("/api/jobs/orders/snapshots?offset=180&limit=50", headers=viewer).json()
    assert [s["id"] for s in last["snapshots"]] == ids[::-1][180:]

    # opened at a snapshot (the task's extra link): the page that holds it
    old = ids[7]  # 193rd newest: on the fourth page
    focused = client.get(f"/api/jobs/orders/snapshots?focus={old}", headers=viewer).json()
    assert focused["offset"] == 150 and focused["focus_found"] is True
    assert old in [s["id"] for s in focused["snapshots"]]
    gone = client.get("/api/jobs/orders/snapshots?focus=sp-20000101T000000000Z-0000", headers=viewer).json()
    assert gone["focus_found"] is False and gone["offset"] == 0

    checkpoints = client.get("/api/jobs/orders/snapshots?kind=checkpoint&limit=500", headers=viewer).json()
    assert checkpoints["total"] == SNAPSHOTS // CHECKPOINT_EVERY and checkpoints["all"] == SNAPSHOTS
    assert {s["kind"] for s in checkpoints["snapshots"]} == {"checkpoint"}

    too_many = client.get("/api/jobs/orders/snapshots?limit=100000", headers=viewer)
    assert too_many.status_code == 422


def test_the_page_marks_a_snapshot_whose_kafka_records_are_gone(
    airflow_app: FastAPI, kafka: EmbeddedKafka, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic()
    kafka.produce(topic, [f"r{i}" for i in range(6)])
    store_dir, checkpoint = tmp_path / "store", write_checkpoint(tmp_path / "ckpt", batches=1)
    store, source = SnapshotStore(open_storage(str(store_dir))), open_storage(str(checkpoint))
    kafka_offsets(checkpoint, 0, {topic: {0: 2}})
    expired = create_snapshot(store, source, SnapshotRequest(job="streams")).id
    add_batch(checkpoint, 1)
    kafka_offsets(checkpoint, 1, {topic: {0: 5}})
    held = create_snapshot(store, source, SnapshotRequest(job="streams")).id
    kafka.delete_records(topic, {0: 4})  # retention: offsets 2 and 3 are gone
    jobs_file = tmp_path / "jobs.toml"
    jobs = jobs_toml(store_dir, tmp_path / "checkpoints", ("streams",))
    jobs_file.write_text(jobs + f'kafka = {{ bootstrap_servers = "{kafka.bootstrap}" }}\n')
    with TestClient(create_app(PageSettings(jobs_file=str(jobs_file)))) as page:
        answer = page.get("/api/jobs/streams/snapshots", headers=bearer(*VIEWER)).json()
    rows = {row["id"]: row for row in answer["snapshots"]}
    assert rows[expired]["source_check"]["records_lost"] == 2 and not rows[expired]["source_check"]["restorable"]
    assert rows[held]["source_check"]["restorable"] is True
    assert rows[held]["source_positions"] == [{"source": "0", "kind": "kafka", "offset": {topic: {"0": 5}}}]


def test_an_empty_job_and_an_empty_jobs_file_are_plain_empty_answers(
    client: TestClient, world: dict[str, Any], tmp_path: Path
) -> None:
    viewer = bearer(*VIEWER)
    quiet = client.get("/api/jobs/quiet/snapshots", headers=viewer).json()
    assert (quiet["total"], quiet["all"], quiet["snapshots"], quiet["timeline"]) == (0, 0, [], [])
    nothing_runs = client.get("/api/jobs/quiet/deployments", headers=viewer).json()
    assert nothing_runs["deployments"] == []
    assert nothing_runs["savepoint"]["possible"] is False  # the page disables "Take savepoint" and says why
    assert "has no running deployment" in nothing_runs["savepoint"]["reason"]
    assert "savepoints deploy quiet" in nothing_runs["savepoint"]["reason"]

    empty = tmp_path / "jobs.toml"
    empty.write_text("# no jobs yet\n")
    with TestClient(create_app(PageSettings(jobs_file=str(empty)))) as other:
        assert other.get("/api/jobs", headers=viewer).json() == {"jobs_file": str(empty), "jobs": []}


def test_a_store_that_cannot_be_reached_is_a_clear_message_not_a_traceback(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "do-not-show-this-secret"
    connection = {
        "conn_type": "aws",
        "login": "AKIDUNREACHABLE",
        "password": secret,
        "extra": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_UNREACHABLE_S3", json.dumps(connection))
    jobs_file = tmp_path / "jobs.toml"
    jobs_file.write_text(jobs_toml("s3://unreachable-bucket/snapshots", tmp_path / "checkpoints", ("orders",)))
    viewer = bearer(*VIEWER)
    with TestClient(create_app(PageSettings(jobs_file=str(jobs_file), aws_conn_id="unreachable_s3"))) as c:
        started = time.monotonic()
        for path in ("/api/jobs/orders/snapshots", "/api/jobs/orders/deployments"):
            response = c.get(path, headers=viewer)
            assert response.status_code == 503, response.text
            body = response.json()
            assert body["kind"] == "StoreUnavailable"
            assert f"cannot reach the S3 endpoint http://127.0.0.1:{port}" in body["error"]
            assert "s3://unreachable-bucket/snapshots" in body["error"]
            assert "Traceback" not in response.text and secret not in response.text
        assert time.monotonic() - started < 30  # a few attempts, not botocore's ten with backoff

    broken = tmp_path / "broken.toml"
    broken.write_text("[jobs.orders\n")
    with TestClient(create_app(PageSettings(jobs_file=str(broken)))) as c:
        response = c.get("/api/jobs", headers=viewer)
        assert response.status_code == 400
        assert response.json()["error"].startswith(f"jobs file {broken} is not valid TOML")


def test_the_restore_commands_run_as_printed(client: TestClient, world: dict[str, Any]) -> None:
    row = client.get("/api/jobs/orders/snapshots?limit=1", headers=bearer(*VIEWER)).json()["snapshots"][0]
    commands = row["commands"]
    jobs_file, store = world["jobs_file"], world["store_dir"]
    assert commands["deploy"] == f"savepoints deploy orders --jobs {jobs_file} --version v1 --restore {row['id']}"
    restore = shlex.split(commands["restore"])
    assert restore[:6] == ["savepoints", "restore", "orders", row["id"], "--store", str(store)]
    target = Path(restore[restore.index("--to") + 1])
    assert not target.exists()

    result = subprocess.run(
        [sys.executable, "-m", "airflow_plugin", *restore[1:]], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    manifest = world["store"].get("orders", row["id"])
    assert set(tree(target)) == {f.path for f in manifest.files}
    for name in ("show", "verify"):
        shown = subprocess.run(
            [sys.executable, "-m", "airflow_plugin", *shlex.split(commands[name])[1:], "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, (name, shown.stderr)


@pytest.mark.parametrize(
    ("label", "status"),
    [
        ("note=two\nlines", 400),  # one line only, as everywhere (manifest.parse_labels)
        ("<img src=x onerror=alert(1)>=x", 400),  # keys are names
        ("note=<script>alert('x')</script> \"quoted\"", 201),  # values are data: kept verbatim, shown as text
    ],
)
def test_labels_from_the_page_are_checked_like_the_clis(client: TestClient, label: str, status: int) -> None:
    before = len(savepoint_runs("quiet"))
    response = client.post("/api/jobs/quiet/savepoints", json={"label": label}, headers=bearer(*USER))
    assert response.status_code == status, response.text
    runs = savepoint_runs("quiet")
    if status == 400:
        assert "label" in response.json()["error"] and len(runs) == before
    else:
        assert len(runs) == before + 1 and runs[-1].conf["label"] == label
