"""The savepoints page as a person uses it: headless Chromium (Debian's, driven by playwright's Python API)
against a real `airflow api-server` with the plugin, a scheduler and a DAG processor, while a real
deployment of the windowed job runs against the embedded S3 store. Log in through Airflow's login page,
open the savepoint and upgrade DAGs' trigger forms (ready to send, no internal field; the upgrade's new
version left to choose), open "Savepoints" from Airflow's navigation (the running deployment's rows per
second, not the 0 of Spark's no-data batches; the timeline from the deployment's start, before its first
snapshot), click "Take savepoint", see the new snapshot COMPLETED, the banner saying its run succeeded and
its state in the chart, pin it, see the Upgrade action offer the other versions; follow the savepoint task's
extra link to the page opened at that snapshot; stop the job and see "Take savepoint" and "Upgrade" disabled
with the reason; deploy it again from the page ("Deploy": the deploy DAG, run by the scheduler, its run followed in
the banner) and see the new deployment run and "Take savepoint" offered again. Screenshots are kept in
tests/artifacts/."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.savepoint import take_savepoint
from airflow_plugin.core.jobs.stop import kill
from airflow_plugin.links import snapshot_page_url
from airflow_plugin.ui.security import DEPLOY_DAG_ID, SAVEPOINT_DAG_ID
from devtools.embedded_s3 import EmbeddedS3
from devtools.windowed import Feeder, processed, wait_for, write_jobs_file
from tests.support.jobs import kill_every_deployment
from tests.support.ui_support import BROWSER_WAIT_MS, HTTP_WAIT_S, AirflowStack

pytestmark = [pytest.mark.slow, pytest.mark.spark]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def _wait_ready(airflow: AirflowStack) -> str:
    """Until the API server answers and the scheduler is healthy; returns an admin token from /auth/token."""

    def healthy() -> bool:
        airflow.check_alive()
        try:
            health = httpx.get(f"{airflow.url}/api/v2/monitor/health", timeout=5)
        except httpx.HTTPError:
            return False
        return health.status_code == 200 and health.json().get("scheduler", {}).get("status") == "healthy"

    wait_for(healthy, "the Airflow API server and a healthy scheduler", timeout=150)
    login = httpx.post(
        f"{airflow.url}/auth/token",
        json={"username": "admin", "password": airflow.passwords["admin"]},
        timeout=HTTP_WAIT_S,
    )
    assert login.status_code == 201, login.text
    return str(login.json()["access_token"])


MARKUP = """<img src=x onerror="document.title='owned'"> 'single' "double" </td>"""


def test_a_person_takes_a_savepoint_from_the_page(tmp_path: Path, s3_server: EmbeddedS3, s3_store: str) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (`make test` tries to)", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=BROWSER_WAIT_MS)

    jobs_file = write_jobs_file(tmp_path, s3_store)
    job = Settings(jobs_file=str(jobs_file)).resolve().job("windowed")
    store = job.store
    env = {"SAVEPOINTS_JOBS": str(jobs_file), "AIRFLOW_CONN_AWS_DEFAULT": s3_server.airflow_connection()}
    ARTIFACTS.mkdir(exist_ok=True)

    with AirflowStack(tmp_path / "airflow", env) as airflow:
        feed = Feeder(tmp_path / "input")
        deployment = deploy(job, DeployRequest("v1"))  # while Airflow starts
        try:
            earlier = []
            for reason in ("first", MARKUP):  # two earlier savepoints: something on the timeline
                feed.round()
                wait_for(lambda: processed(deployment.checkpoint, feed.rounds), f"the job to process round {reason}")
                earlier.append(take_savepoint(job, labels={"reason": reason}).id)
            feed.round()
            wait_for(lambda: processed(deployment.checkpoint, feed.rounds), "the job to process the third round")
            token = _wait_ready(airflow)
            api = httpx.Client(base_url=airflow.url, headers={"Authorization": f"Bearer {token}"}, timeout=HTTP_WAIT_S)

            def dag_parsed() -> bool:
                airflow.check_alive()
                return api.get(f"/api/v2/dags/{SAVEPOINT_DAG_ID}").status_code == 200

            wait_for(dag_parsed, "the dag-processor to parse the savepoint DAG", timeout=120)
            # savepoints only: the retention DAG, which the scheduler starts at once, may add checkpoints meanwhile
            before = {m.id for m in store.list(job.name) if m.kind == "savepoint"}

            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
                )
                page = browser.new_page(viewport={"width": 1440, "height": 1000})
                page.set_default_timeout(BROWSER_WAIT_MS)

                # log in through Airflow's own login page
                page.goto(f"{airflow.url}/")
                page.wait_for_url("**/auth/login**")
                page.fill("input[name=username]", "admin")
                page.fill("input[name=password]", airflow.passwords["admin"])
                page.click("button[type=submit]")
                page.wait_for_url(lambda url: "/auth/" not in url)

                # the DAGs' trigger forms open ready to send: no internal field, an optional label; the upgrade's
                # new version is the person's choice (no default: the default version is usually the running one)
                for dag_id in ("savepoints_savepoint", "savepoints_upgrade"):
                    page.goto(f"{airflow.url}/dags/{dag_id}")
                    page.get_by_role("button", name="Trigger").first.click()
                    dialog = page.get_by_role("dialog")
                    send = dialog.get_by_role("button", name="Trigger", exact=True)
                    expect(dialog.locator("#element_job")).to_contain_text("windowed")
                    if dag_id == "savepoints_savepoint":
                        expect(dialog.locator("#element_label")).to_be_visible()
                        expect(dialog.locator("#element_trigger")).to_have_count(0)
                        expect(send).to_be_enabled()
                    else:
                        expect(dialog.locator("#element_version")).to_contain_text("Select Value")
                        expect(send).to_be_disabled()
                        dialog.locator("#element_version").click()
                        page.get_by_role("option", name="v2", exact=True).click()
                        expect(send).to_be_enabled()
                    page.screenshot(path=str(ARTIFACTS / f"form-{dag_id}.png"))
                    page.keyboard.press("Escape")
                    expect(dialog).to_have_count(0)

                # "Savepoints" in Airflow's navigation opens the page (embedded: the external view)
                page.goto(f"{airflow.url}/")
                page.get_by_role("link", name="Savepoints", exact=True).click()
                # the URL, polled: the link navigates inside the app (pushState), and in ci23 wait_for_url missed
                # that navigation though the page had opened (its iframe loaded and polled for a minute)
                expect(page).to_have_url(re.compile(r"/plugin/savepoints$"))
                frame = page.frame_locator("iframe")
                expect(frame.locator("#job-name")).to_have_text("windowed")
                expect(frame.locator("#deployments tbody tr")).to_have_count(1)
                expect(frame.locator("#deployments tbody tr").first).to_contain_text("RUNNING")
                # busy: rows per second over the last minute, though the watermark's no-data batch that follows
                # each batch of data makes Spark's own figure of the last batch 0 (what the page showed)
                feed.round()
                wait_for(lambda: processed(deployment.checkpoint, feed.rounds), "the job to process a fourth round")
                rate = frame.locator("#deployments tbody tr").first.locator("td").nth(5)
                expect(rate).to_have_text(re.compile(r"^[1-9][0-9,]*$"), timeout=30_000)
                expect(frame.locator("#deployments tbody tr").first.locator("td").nth(6)).to_have_text("")  # no Kafka
                # the timeline starts where the deployment started (batch 0), before its first snapshot
                line = frame.locator(f'#timeline polyline.live[data-deployment="{deployment.id}"]')
                expect(line).to_have_attribute("points", re.compile(r"^56\.0,172\.0 "))
                savepoint_rows = frame.locator('#snapshots tbody tr[data-id^="sp-"]')
                expect(savepoint_rows.filter(has_text="COMPLETED")).to_have_count(len(before))
                # the Upgrade action offers every version but the running one (its runs: test_ui_api.py)
                others = sorted(v for v in job.spec.versions if v != "v1")
                expect(frame.locator("#upgrade-version option")).to_have_text(others)
                expect(frame.locator("#upgrade-button")).to_be_enabled()

                frame.locator("#savepoint-button").click()
                unseen = "".join(f':not([data-id="{snapshot_id}"])' for snapshot_id in before)
                new_row = frame.locator(f'#snapshots tbody tr[data-id^="sp-"]{unseen}')
                failed_run = frame.locator("#runs .s-failed")
                deadline = time.monotonic() + 180
                while not new_row.filter(has_text="COMPLETED").count():
                    airflow.check_alive()
                    assert not failed_run.count(), f"the savepoint run failed:\n{airflow.log_tail('scheduler')}"
                    assert time.monotonic() < deadline, "no new COMPLETED snapshot on the page after 180 s"
                    page.wait_for_timeout(500)  # the page polls every 2 s while a run is in flight
                new_id = new_row.first.get_attribute("data-id")
                assert new_id and new_id not in before
                # the banner follows the run it announced as queued, to its end
                expect(frame.locator("#banner")).to_contain_text("succeeded: its savepoint is in the list below")
                # the state chart: what the snapshots recorded per operator (rows from the running query's progress)
                recorded = store.get(job.name, new_id).state
                assert recorded and all(op["bytes"] > 0 and op["rows"] is not None for op in recorded), recorded
                expect(frame.locator("#state-section")).to_be_visible()
                expect(frame.locator("#state-chart polyline")).to_have_count(len(recorded))
                expect(frame.locator("#state-skew")).to_contain_text("largest/mean")

                # pin it from the page: the manifest in the store says so
                new_row.first.locator("button.pin").click()
                expect(new_row.first.locator("button.pin")).to_have_text("pinned")
                assert store.get(job.name, new_id).pinned
                page.screenshot(path=str(ARTIFACTS / "savepoints-in-airflow.png"))

                # a label with markup and quotes (kept verbatim by the engine) shows as text, never as HTML
                marked = frame.locator(f'#snapshots tbody tr[data-id="{earlier[1]}"]')
                marked.locator("button", has_text="Restore").click()
                details = frame.locator("#snapshots tr.details").filter(has_text="Labels:")
                expect(details).to_contain_text(f"reason={MARKUP}")
                expect(frame.locator("#snapshots img")).to_have_count(0)

                # Airflow's own history: the run, triggered from the UI by admin, for this job
                runs = api.get(f"/api/v2/dags/{SAVEPOINT_DAG_ID}/dagRuns", params={"order_by": "-run_after"}).json()
                run = runs["dag_runs"][0]
                assert run["conf"]["job"] == "windowed" and run["triggering_user_name"] == "admin"
                assert run["triggered_by"] == "ui"

                # the task's extra link opens the page at the snapshot it took
                links_path = (
                    f"/api/v2/dags/{SAVEPOINT_DAG_ID}/dagRuns/{quote(run['dag_run_id'])}/taskInstances/savepoint/links"
                )
                wait_for(
                    lambda: bool(api.get(links_path).json()["extra_links"].get("Snapshot")),
                    "the task's extra link",
                    timeout=60,
                )
                link = api.get(links_path).json()["extra_links"]["Snapshot"]
                assert link == snapshot_page_url("windowed", new_id)
                page.goto(airflow.url + link)
                focused = page.locator(f'#snapshots tr.focus[data-id="{new_id}"]')
                expect(focused).to_be_in_viewport()
                expect(focused).to_contain_text("COMPLETED")
                expect(page.locator("#snapshots tr.details input").first).to_have_value(
                    f"savepoints deploy windowed --jobs {jobs_file} --version v1 --restore {new_id}"
                )
                # the whole page from its top: scrolled to the row, the tables' sticky headers slide over the rows
                # of the tables above the viewport (the deployments table looked empty in the shot)
                page.evaluate("window.scrollTo(0, 0)")
                page.screenshot(path=str(ARTIFACTS / "savepoints-page.png"), full_page=True)
                expect(page.locator("#savepoint-button")).to_be_enabled()

                expect(page.locator("#deploy-button")).to_be_disabled()  # it runs: deploying it again is refused
                expect(page.locator("#deploy-reason")).to_contain_text(f"already has deployment {deployment.id}")

                # nothing runs any more: the button is disabled and the page says why (it refreshes by itself)
                kill(job)
                expect(page.locator("#savepoint-button")).to_be_disabled(timeout=30_000)
                expect(page.locator("#savepoint-reason")).to_contain_text("has no running deployment")
                expect(page.locator("#savepoint-reason")).to_contain_text("savepoints deploy windowed")
                expect(page.locator("#upgrade-button")).to_be_disabled()
                expect(page.locator("#upgrade-reason")).to_contain_text("No deployment is running")
                page.screenshot(path=str(ARTIFACTS / "nothing-runs.png"), full_page=True)

                # a person who lives in the UI starts it again from the page: the deploy DAG through the scheduler,
                # the version of the deployment that ran, from its latest state
                deploy_button = page.locator("#deploy-button")
                expect(deploy_button).to_be_enabled()
                expect(page.locator("#deploy-version")).to_have_value("v1")
                expect(page.locator("#deploy-restore")).to_have_value("latest-state")
                deploy_button.click()
                expect(page.locator("#banner")).to_contain_text("Deploy run")
                # the new deployment, newest first, runs (STARTING first: Spark starts on a busy machine)
                newest = page.locator("#deployments tbody tr").first
                expect(newest).not_to_have_attribute("data-id", deployment.id, timeout=180_000)
                expect(newest).to_contain_text("RUNNING", timeout=240_000)
                expect(page.locator("#savepoint-button")).to_be_enabled()
                expect(page.locator("#deploy-button")).to_be_disabled()
                # the run waits for the deployment's health (a deferred sensor: this Airflow runs no triggerer)
                expect(page.locator("#banner")).to_contain_text("then the run waits until it is healthy")
                page.screenshot(path=str(ARTIFACTS / "deployed-from-the-page.png"), full_page=True)
                browser.close()

            # Airflow's history: the deploy run, triggered from the UI by admin, with the job, the version and restore
            [run] = api.get(f"/api/v2/dags/{DEPLOY_DAG_ID}/dagRuns").json()["dag_runs"]
            assert run["conf"] == {"job": "windowed", "version": "v1", "restore": "latest-state"}, run
            assert (run["triggering_user_name"], run["triggered_by"]) == ("admin", "ui"), run
            [redeployed] = [d for d in job.deployments.list(job.name) if d.id != deployment.id]
            assert redeployed.version == "v1" and redeployed.restored_from, redeployed
        finally:
            kill_every_deployment(job)
    assert store.get(job.name, new_id).status == "COMPLETED"
    assert store.get(job.name, new_id).trigger == "UI"  # the page's conf, not a field of the DAG's form
