"""The autoscaler on the savepoints page (issue 54, "Seen"), from a store written as the reconcile loop writes it
(no Spark, no apply): through the API, the job's autoscaler with its deployments (mode, size, min..max, the last
recommendation and why, the last rescale, a held scale-up), the fleet row's, and the newest upgrade named as the
rescale it was; in Debian's chromium, the fleet row and the job view showing them, the command that clears a held
scale-up among them, and the upgrade shown as "rescale 2 -> 4" rather than "v1 to v1"."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_plugin.core.autoscale.decide import Rescale
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.spec import load_jobs
from airflow_plugin.core.reconcile import record as records
from airflow_plugin.core.reconcile.record import Reconciled
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
from airflow_plugin.ui.app import create_app
from airflow_plugin.ui.views import PageSettings
from tests.airflow.test_ui_fleet import ARTIFACTS, Served, browsing
from tests.support.ui_support import bearer

REASON = "utilisation 0.93 above the target 0.7; the backlog grew by 900 records in 300 s, to 4000"
HELD = "the scale-up from 2 to 4 did not raise the processing rate by a tenth of what it should have"


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory, airflow_app: FastAPI) -> FastAPI:
    """`orders` declared on local[2] with an autoscaler of 1..8 cores, running at 4 after a rescale from 2 that
    was DONE in 42 s and found ineffective (scale-ups held), recommended 6; `plain` declared without one."""
    root = tmp_path_factory.mktemp("autoscale")
    store = str(root / "store")
    body = f'[defaults]\nstore = "{store}"\ncheckpoint_root = "{root}/checkpoints"\nheartbeat_timeout = 3600\n'
    body += '\n[jobs.orders]\nspark_master = "local[2]"\nversions.v1 = { application = "job.py" }\n'
    body += 'desired = { version = "v1" }\nautoscale = { max = 8 }\n'
    body += '\n[jobs.plain]\nversions.v1 = { application = "job.py" }\ndesired = { version = "v1" }\n'
    (root / "jobs.toml").write_text(body)
    storage = open_storage(store)
    deployments = Deployments(storage)
    running = Deployment("dp-20261129T000000000Z-0002", "orders", "v1", f"{root}/checkpoints/b", master="local[4]")
    deployments.put(running)
    deployments.write_status("orders", running.id, DeploymentStatus(State.RUNNING, time.time(), last_batch_id=9))
    now = time.time()
    rescale = Rescale(now - 900, 2, 4, "behind", {}, upgrade="up-1", outcome="DONE", seconds=42.0, effective=False)
    recommendation = {"at": now, "direction": "up", "size": 6, "current": 4, "reason": REASON, "figures": {}}
    kept = Reconciled("orders", rescales=[rescale], recommendation=recommendation, scale_up_held=HELD)
    kept.scale_up_held_under = load_jobs(str(root / "jobs.toml"))["orders"].fingerprint  # held under this file
    kept.rescales_total = 1
    records.write(storage, kept)
    upgrade = Upgrade(id="up-20261129T000000000Z-0001", job="orders", to_version="v1", mode="stop_restore")
    upgrade.old_version, upgrade.size, upgrade.from_size = "v1", 4, 2
    upgrade.move(Phase.DONE, "v1 runs at 4")
    Upgrades(storage).put(upgrade)
    return create_app(PageSettings(jobs_file=str(root / "jobs.toml")))


def test_the_api_gives_the_autoscaler_and_the_rescale(page: FastAPI) -> None:
    viewer = bearer("viewer", "viewer")
    with TestClient(page) as client:
        job = client.get("/api/jobs/orders/deployments", headers=viewer).json()
        fleet = {r["job"]: r for r in client.get("/api/fleet", headers=viewer).json()["jobs"]}
        newest = client.get("/api/jobs/orders/upgrades", headers=viewer).json()["newest"]
        plain = client.get("/api/jobs/plain/deployments", headers=viewer).json()
    autoscale: dict[str, Any] = job["autoscale"]
    assert (autoscale["mode"], autoscale["knob"], autoscale["size"], autoscale["max"]) == ("active", "cores", 4, 8)
    assert autoscale["recommendation"]["size"] == 6 and autoscale["recommendation"]["reason"] == REASON
    assert autoscale["scale_up_held"] == HELD and autoscale["last_rescale"]["outcome"] == "DONE"
    assert fleet["orders"]["declared"]["autoscale"] == autoscale, "the fleet row carries the same"
    assert plain["autoscale"] is None and fleet["plain"]["declared"]["autoscale"] is None
    assert newest["title"] == "rescale 2 -> 4" and newest["rescale"] == {"from_size": 2, "size": 4, "partitions": None}


def test_a_person_sees_the_autoscaler_on_the_fleet_and_the_jobs_page(page: FastAPI) -> None:
    from playwright.sync_api import expect

    with Served(page) as url, browsing(url, bearer("viewer", "viewer")) as view:
        declared = view.locator('#fleet-table tr[data-job="orders"] td').last
        expect(declared).to_contain_text("active autoscale: 4 cores (1..8), 6 recommended, scale-ups held")
        assert REASON in (declared.get_attribute("title") or ""), "the reason in the cell's tooltip"

        view.locator('#fleet-table tr[data-job="orders"]').click()
        section = view.locator("#autoscale-section")
        expect(section).to_be_visible()
        expect(section).to_contain_text("active size 4 cores, from 1 to 8 · recommended 6: scale up")
        expect(section.locator('[data-field="reason"]')).to_contain_text(REASON)
        expect(section).to_contain_text("Last rescale 2 -> 4: DONE in 42 s, ineffective")
        expect(section).not_to_contain_text("null")
        expect(section.locator('[data-field="held"]')).to_contain_text(f"Scale-ups held: {HELD}")
        expect(section.locator('[data-field="held"] code')).to_have_text("savepoints apply orders --retry")
        expect(view.locator("#upgrade-status")).to_contain_text("up-20261129T000000000Z-0001: rescale 2 -> 4 (v1)")
        expect(view.locator("#upgrade-status")).not_to_contain_text("v1 to v1")
        view.screenshot(path=str(ARTIFACTS / "job-autoscale.png"), full_page=True)

        view.locator("#to-fleet").click()
        view.locator('#fleet-table tr[data-job="plain"]').click()
        expect(view.locator("#job-name")).to_have_text("plain")
        expect(view.locator("#deployments-empty")).to_be_visible()
        expect(view.locator("#autoscale-section")).to_be_hidden()
