"""The fleet overview of the savepoints page, with 100 jobs in one S3 store written as savepoints wrote stores
before catalogs (records only: the first read builds the catalogs). Through the API: every job's row, the
unhealthy ones first with why, and the fleet in a line. In Debian's chromium (playwright), on the page served by
uvicorn with Airflow's authentication: 100 rows, unhealthy first, sorting by a column (both ways, jobs without a
value last), a row opening today's job view, and back. And a fleet where nothing runs (jobs never deployed, one
starting, one stopped): never "all healthy", but "nothing runs" and "never deployed"; a starting job's page
offers no savepoint and no deploy, with why; a job never deployed offers Deploy."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_plugin.core.layout import deployment_key, status_key
from airflow_plugin.core.parallel import run_parallel
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import SnapshotStatus
from airflow_plugin.core.storage import open_storage
from airflow_plugin.ui.app import create_app
from airflow_plugin.ui.views import PageSettings
from devtools.embedded_s3 import EmbeddedS3
from devtools.ports import free_port
from tests.support.catalogs import manifest
from tests.support.ui_support import BROWSER_WAIT_MS, bearer, recorded_deployment

if TYPE_CHECKING:
    from playwright.sync_api import Page

JOBS = 100
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


# whose deployment's heartbeat says RUNNING: all but the LOST, the FAILED and those with none running (below)
RUNNING = sum(1 for n in range(JOBS) if n % 10 not in (3, 7, 9))


def job_name(n: int) -> str:
    return f"job-{n:03d}"


def expected_trouble(n: int) -> str | None:
    """What each job's records say is wrong (None: healthy)."""
    if n % 10 == 3:
        return "LOST"
    if n % 10 == 7:
        return "FAILED"
    if n % 25 == 5:
        return "skipped them as already written"
    return None


def records(n: int, checkpoints: Path) -> dict[str, bytes]:
    """Job n's objects: a retired deployment, a running one (LOST, FAILED, skipping batches, or none at all for
    every tenth), two COMPLETED savepoints taken n and n+1 minutes ago, and for every fourth job a FAILED one."""
    job, now = job_name(n), time.time()
    objects: dict[str, bytes] = {}
    old = Deployment(f"dp-{n:03d}-a", job, "v1", f"{checkpoints}/{job}/a", retired_at="2026-11-20T10:00:00Z")
    objects[deployment_key(job, old.id)] = old.to_json()
    objects[status_key(job, old.id)] = json.dumps({"state": "STOPPED", "updated_at": now - 86400}).encode()
    if n % 10 != 9:
        live = Deployment(f"dp-{n:03d}-b", job, "v2", f"{checkpoints}/{job}/b")
        status = DeploymentStatus(State.RUNNING, now, last_batch_id=n * 10, kafka_lag=(n * 37) % 100)
        if n % 10 == 3:
            status.updated_at = now - 86400  # no heartbeat for a day
        if n % 10 == 7:
            status.state, status.error_class, status.error_message = State.FAILED, "BOOM", "the job failed"
        if n % 25 == 5:
            status.unprocessed = {"first": 10, "last": 12, "batches": 3, "streak": 3, "records": 0}
        objects[deployment_key(job, live.id)] = live.to_json()
        objects[status_key(job, live.id)] = json.dumps({**vars(status), "state": str(status.state)}).encode()
    at = datetime.now(UTC) - timedelta(minutes=n + 2)
    made = [manifest(job, at=at, pack=n), manifest(job, at=at + timedelta(minutes=1), pack=n)]
    if n % 4 == 0:
        made.append(manifest(job, at=at + timedelta(seconds=30), status=SnapshotStatus.FAILED, pack=n))
    for m in made:
        objects[f"jobs/{job}/snapshots/{m.id}/manifest.json"] = m.to_json()
    return objects


@pytest.fixture(scope="module")
def fleet(s3_server: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fleet")
    store = s3_server.create_bucket("fleet-store") + "/savepoints"
    storage = open_storage(store)
    objects = {key: data for n in range(JOBS) for key, data in records(n, root / "checkpoints").items()}
    list(run_parallel(lambda item: storage.write(*item), objects.items(), concurrency=32))
    jobs_file = root / "jobs.toml"
    # the live heartbeats are written once, here: an hour's timeout keeps them live however long the tests take
    body = f'[defaults]\nstore = "{store}"\ncheckpoint_root = "{root}/checkpoints"\nheartbeat_timeout = 3600\n'
    for n in range(JOBS):
        body += f'\n[jobs.{job_name(n)}]\nversions.v1 = {{ application = "job.py" }}\n'
        body += "desired = {}\n" if n == 0 else ""  # one declared job: the page shows what it should run
    jobs_file.write_text(body)
    return {"jobs_file": jobs_file, "store": store}


@pytest.fixture(scope="module")
def page(fleet: dict[str, Any], airflow_app: FastAPI) -> FastAPI:
    return create_app(PageSettings(jobs_file=str(fleet["jobs_file"])))


def unhealthy_first() -> list[str]:
    trouble = sorted(job_name(n) for n in range(JOBS) if expected_trouble(n))
    return trouble + sorted(job_name(n) for n in range(JOBS) if not expected_trouble(n))


def test_the_fleet_lists_every_job_unhealthy_first_with_why(page: FastAPI) -> None:
    with TestClient(page) as client:
        response = client.get("/api/fleet", headers=bearer("viewer", "viewer"))
    assert response.status_code == 200, response.text
    rows = response.json()["jobs"]
    assert [r["job"] for r in rows] == unhealthy_first()
    troubled, running = sum(1 for n in range(JOBS) if expected_trouble(n)), RUNNING
    summary = response.json()["summary"]
    assert (summary["unhealthy"], summary["running"], summary["never_deployed"]) == (troubled, running, 0)
    assert summary["text"] == f"{troubled} unhealthy · {running} running"
    for row in rows:
        n = int(row["job"].split("-")[1])
        trouble = expected_trouble(n)
        assert (trouble in row["unhealthy"]) if trouble else row["unhealthy"] is None, row
        assert row["failed_snapshots"] == (1 if n % 4 == 0 else 0) and row["snapshots"] == 2 + (n % 4 == 0)
        assert row["last_savepoint_age_s"] == pytest.approx(60 * (n + 1), abs=120)
        declared = row["declared"]
        assert (declared["desired"], declared["restarts_left"]) == ("v1 running", 5) if n == 0 else declared is None
        if n % 10 == 9:
            assert (row["state"], row["deployment"], row["last_batch_id"]) == ("STOPPED", f"dp-{n:03d}-a", None)
        else:
            assert (row["deployment"], row["last_batch_id"], row["kafka_lag"]) == (
                f"dp-{n:03d}-b",
                n * 10,
                n * 37 % 100,
            )


class Served:
    """The page's app behind a real HTTP server on 127.0.0.1 (uvicorn in a thread)."""

    def __init__(self, app: FastAPI) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def served(page: FastAPI) -> Iterator[str]:
    with Served(page) as url:
        yield url


@contextmanager
def browsing(url: str, headers: dict[str, str]) -> Iterator[Page]:
    """Debian's chromium (playwright) on the page at `url`, as the person `headers` authenticate: every action and
    check waits up to BROWSER_WAIT_MS (the first answer of a fleet reads 100 jobs' records). Fails, not skips, where
    chromium is missing: the page's tests are part of CI."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (`make test` tries to)", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=BROWSER_WAIT_MS)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 1000}, extra_http_headers=headers)
            page = context.new_page()
            page.set_default_timeout(BROWSER_WAIT_MS)
            page.goto(f"{url}/")
            yield page
        finally:
            browser.close()


def test_a_person_finds_the_unhealthy_jobs_sorts_them_and_opens_one(served: str) -> None:
    from playwright.sync_api import expect

    with browsing(served, bearer("ops", "user")) as page:
        rows = page.locator("#fleet-table tbody tr")
        expect(rows).to_have_count(JOBS)
        order = unhealthy_first()
        troubled = sum(1 for n in range(JOBS) if expected_trouble(n))
        assert rows.evaluate_all("rows => rows.map(r => r.dataset.job)") == order
        expect(page.locator("#fleet-table tbody tr.unhealthy")).to_have_count(troubled)
        expect(page.locator("#fleet-summary")).to_have_text(f"{troubled} unhealthy · {RUNNING} running")
        expect(rows.first.locator(".reason")).to_contain_text("LOST")
        page.screenshot(path=str(ARTIFACTS / "fleet.png"))

        # sort by Kafka lag, both ways; jobs with no running deployment (no lag) stay last
        lags = {job_name(n): n * 37 % 100 for n in range(JOBS) if n % 10 != 9}
        page.locator('button.sort[data-sort="kafka_lag"]').click()
        ascending = rows.evaluate_all("rows => rows.map(r => r.dataset.job)")
        assert [lags[j] for j in ascending[: len(lags)]] == sorted(lags.values())
        assert set(ascending[len(lags) :]) == {job_name(n) for n in range(JOBS) if n % 10 == 9}
        expect(page.locator('button.sort[data-sort="kafka_lag"]')).to_have_attribute("aria-sort", "ascending")
        page.locator('button.sort[data-sort="kafka_lag"]').click()
        descending = rows.evaluate_all("rows => rows.map(r => r.dataset.job)")
        assert [lags[j] for j in descending[: len(lags)]] == sorted(lags.values(), reverse=True)

        # a row opens today's job view; "All jobs" comes back
        page.locator('#fleet-table tbody tr[data-job="job-042"]').click()
        expect(page.locator("#job-name")).to_have_text("job-042")
        expect(page.locator("#fleet")).to_be_hidden()
        expect(page.locator("#deployments tbody tr")).to_have_count(2)
        # the running deployment's Kafka lag, where the job view shows it; none for the retired one
        lag = page.locator("#deployments thead th").all_text_contents().index("Kafka lag")
        expect(page.locator('#deployments tbody tr[data-id="dp-042-b"] td').nth(lag)).to_have_text(f"{42 * 37 % 100}")
        expect(page.locator('#deployments tbody tr[data-id="dp-042-a"] td').nth(lag)).to_have_text("")
        expect(page.locator("#snapshots tbody tr")).to_have_count(2)
        assert page.url.endswith("?job=job-042")
        page.locator("#to-fleet").click()
        expect(rows).to_have_count(JOBS)
        expect(page.locator("#job")).to_be_hidden()


IDLE = ("never-a", "never-b", "starting", "stopped")


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory, airflow_app: FastAPI) -> FastAPI:
    """Jobs of which nothing runs: two never deployed, one whose deployment is STARTING (its driver has not
    reported RUNNING yet), one stopped; the page over them."""
    root = tmp_path_factory.mktemp("idle")
    store, checkpoints = str(root / "store"), root / "checkpoints"
    body = f'[defaults]\nstore = "{store}"\ncheckpoint_root = "{checkpoints}"\nheartbeat_timeout = 3600\n'
    versions = 'versions.v1 = { application = "job.py" }\nversions.v2 = { application = "job.py" }\n'
    for job in IDLE:
        body += f"\n[jobs.{job}]\n{versions}"
    (root / "jobs.toml").write_text(body)
    recorded_deployment(store, "starting", State.STARTING, checkpoints)
    recorded_deployment(store, "stopped", State.STOPPED, checkpoints)
    return create_app(PageSettings(jobs_file=str(root / "jobs.toml")))


IDLE_SUMMARY = "nothing runs · 1 starting · 2 never deployed"


def test_a_fleet_of_which_nothing_runs_is_not_all_healthy(idle: FastAPI) -> None:
    with TestClient(idle) as client:
        answer = client.get("/api/fleet", headers=bearer("viewer", "viewer")).json()
    assert {r["job"]: r["state"] for r in answer["jobs"]} == {
        "never-a": "NONE",
        "never-b": "NONE",
        "starting": "STARTING",
        "stopped": "STOPPED",
    }
    assert all(r["unhealthy"] is None for r in answer["jobs"])  # none is unhealthy, and none runs either
    summary = answer["summary"]
    assert (summary["running"], summary["starting"], summary["never_deployed"]) == (0, 1, 2)
    assert summary["text"] == IDLE_SUMMARY


def test_a_person_sees_what_does_not_run_and_what_can_be_done_about_it(idle: FastAPI) -> None:
    from playwright.sync_api import expect

    with Served(idle) as url, browsing(url, bearer("ops", "user")) as page:
        rows = page.locator("#fleet-table tbody tr")
        expect(rows).to_have_count(len(IDLE))
        expect(page.locator("#fleet-summary")).to_have_text(IDLE_SUMMARY)
        expect(page.locator('#fleet-table tr[data-job="never-a"] td').nth(1)).to_have_text("never deployed")
        page.screenshot(path=str(ARTIFACTS / "fleet-idle.png"))

        # a deployment on its way is not one that runs: no savepoint, no upgrade, no second deploy; each says why
        page.locator('#fleet-table tr[data-job="starting"]').click()
        expect(page.locator("#deployments tbody tr").first).to_contain_text("STARTING")
        expect(page.locator("#savepoint-button")).to_be_disabled()
        expect(page.locator("#savepoint-reason")).to_contain_text("is STARTING; a savepoint can be taken once it runs")
        expect(page.locator("#upgrade-button")).to_be_disabled()
        expect(page.locator("#upgrade-reason")).to_contain_text("is STARTING: an upgrade can begin once one runs")
        expect(page.locator("#deploy-button")).to_be_disabled()
        expect(page.locator("#deploy-reason")).to_contain_text("already has deployment")
        page.screenshot(path=str(ARTIFACTS / "job-starting.png"))

        # a job never deployed: Deploy is offered, the jobs file's default version chosen, from its latest state
        page.locator("#to-fleet").click()
        page.locator('#fleet-table tr[data-job="never-b"]').click()
        expect(page.locator("#deployments-empty")).to_contain_text("No deployment of never-b yet")
        expect(page.locator("#deploy-button")).to_be_enabled()
        expect(page.locator("#deploy-reason")).to_be_hidden()
        expect(page.locator("#deploy-version")).to_have_value("v1")
        expect(page.locator("#deploy-restore")).to_have_value("latest-state")
        expect(page.locator("#savepoint-button")).to_be_disabled()
        expect(page.locator("#savepoint-reason")).to_contain_text("has no running deployment")
        page.screenshot(path=str(ARTIFACTS / "job-never-deployed.png"))
