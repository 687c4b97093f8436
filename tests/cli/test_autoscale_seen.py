"""The autoscaler as people see it (issue 54, "Seen"), from a store written as the reconcile loop writes it (no
Spark, no apply): `savepoints status JOB` and its JSON (mode, the size the job runs at on its knob, min..max, the
last recommendation and why, the last rescale, a held scale-up and the command that clears it), and a rescale in
the job's upgrades named as one (`rescale 2 -> 4`), not as an upgrade of a version to itself."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.autoscale.decide import Rescale
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.spec import load_jobs
from airflow_plugin.core.reconcile import record as records
from airflow_plugin.core.reconcile.record import Reconciled
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
from tests.support.jobs import write_jobs
from tests.support.synthetic import ROCKSDB, write_checkpoint

HELD = "the scale-up from 2 to 4 did not raise the processing rate by a tenth of what it should have"
REASON = "utilisation 0.93 above the target 0.7; the backlog grew by 900 records in 300 s, to 4000"


def behind(now: float) -> list[dict[str, object]]:
    """The heartbeat's load of a job that cannot keep up: batches back to back for 5 minutes (the default window),
    the Kafka backlog growing by 500 records every 10 s."""
    start = int(now) - 300
    return [
        {"t": t, "batches": 1, "rows": 1000, "busy_ms": 10_000, "backlog": (t - start) * 50}
        for t in range(start, int(now), 10)
    ]


def declare(tmp_path: Path, mode: str = "active", load: list[dict[str, object]] | None = None) -> Path:
    """Job `orders` declared on local[2] with an autoscaler of 1..8 cores, and running at 4 (a rescale's deployment,
    launched at local[4]) on 4 state partitions: the size status shows is the running deployment's, not the jobs
    file's."""
    extra = f'spark_master = "local[2]"\ndesired = {{ version = "v1" }}\nautoscale = {{ max = 8, mode = "{mode}" }}'
    jobs = write_jobs(tmp_path, extra=extra)
    storage = open_storage(str(tmp_path / "store"))
    deployments = Deployments(storage)
    retired = Deployment("dp-20260101T000000000Z-0001", "orders", "v1", "cp1", master="local[2]", retired_at="x")
    checkpoint = write_checkpoint(tmp_path / "cp2", 3, partitions=4, provider=ROCKSDB)  # Spark repartitions it
    running = Deployment("dp-20260101T000000000Z-0002", "orders", "v1", str(checkpoint), master="local[4]")
    running.spark_conf = {"spark.sql.shuffle.partitions": "4"}
    for deployment in (retired, running):
        deployments.put(deployment)
    heartbeat = DeploymentStatus(State.RUNNING, time.time(), last_batch_id=9, load=load or [])
    deployments.write_status("orders", running.id, heartbeat)
    return jobs


def record(tmp_path: Path, **recommended: object) -> None:
    """What the loop recorded: a scale-up from 2 to 4 that went DONE in 42 s and was found ineffective (so
    scale-ups are held), and the last recommendation: up to 6, the state repartitioned to 6."""
    now = time.time()
    rescale = Rescale(now - 900, 2, 4, "behind", {}, upgrade="up-1", outcome="DONE", seconds=42.0, effective=False)
    recommendation = {"at": now, "direction": "up", "size": 6, "current": 4, "reason": REASON, "figures": {}}
    recommendation |= {"partitions": 6, **recommended}
    under = load_jobs(str(tmp_path / "jobs.toml"))["orders"].fingerprint  # held under this jobs file
    kept = Reconciled("orders", rescales=[rescale], recommendation=recommendation, scale_up_held=HELD)
    kept.scale_up_held_under, kept.rescales_total = under, 1
    records.write(open_storage(str(tmp_path / "store")), kept)


def status(capsys: pytest.CaptureFixture[str], jobs: Path, *more: str) -> str:
    assert main(["status", "orders", "--jobs", str(jobs), *more]) == 0
    return capsys.readouterr().out


def test_status_shows_the_autoscaler_its_recommendation_last_rescale_and_a_held_scale_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = declare(tmp_path)
    record(tmp_path)
    shown = " ".join(status(capsys, jobs).split())  # the console wraps long lines
    assert "autoscale (active): at 4 cores, 1..8" in shown, shown
    assert f"scale up 4 -> 6, state to 6 partitions: {REASON}" in shown, shown
    assert "last rescale (1 recorded): 2 -> 4, DONE in 42 s, INEFFECTIVE" in shown, shown
    assert f"scale-ups held: {HELD}; `savepoints apply orders --retry` clears it" in shown, shown
    assert "passive" not in shown and "BEHIND AT ITS MAX" not in shown

    *_, row = json.loads(status(capsys, jobs, "--json"))  # the running deployment, after the retired one
    autoscale = row["declared"]["autoscale"]
    assert (autoscale["mode"], autoscale["knob"], autoscale["size"], autoscale["min"], autoscale["max"]) == (
        "active",
        "cores",
        4,
        1,
        8,
    )
    assert autoscale["recommendation"]["size"] == 6 and autoscale["recommendation"]["reason"] == REASON
    last = autoscale["last_rescale"]
    assert (last["from_size"], last["to_size"], last["outcome"], last["seconds"]) == (2, 4, "DONE", 42.0)
    assert (autoscale["rescales"], autoscale["scale_up_held"]) == (1, HELD)


def test_a_passive_autoscaler_says_it_does_not_act_and_a_job_behind_at_its_max_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = declare(tmp_path, mode="passive")
    record(tmp_path)
    shown = " ".join(status(capsys, jobs).split())
    assert (
        "autoscale (passive): at 4 cores" in shown
        and "scale up 4 -> 6, state to 6 partitions (passive: not acted on)" in shown
    ), shown

    record(tmp_path, direction="keep", size=8, current=8, partitions=None, behind_at_max=True, reason="at max")
    shown = " ".join(status(capsys, jobs).split())
    assert "keep 8; BEHIND AT ITS MAX SIZE: at max" in shown, shown

    job = Settings(jobs_file=str(jobs)).resolve().job("orders")
    Deployments(job.store.storage).put(
        Deployment("dp-20260101T000000000Z-0002", "orders", "v1", "cp2", master="local[4]", retired_at="y")
    )
    shown = " ".join(status(capsys, jobs).split())
    assert "autoscale (passive): not running cores, 1..8" in shown, "nothing runs: no size"


def test_a_rescale_in_the_jobs_upgrades_is_shown_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = declare(tmp_path)
    upgrades = Upgrades(open_storage(str(tmp_path / "store")))
    upgrade = Upgrade(id="up-20260101T000000000Z-0001", job="orders", to_version="v1", mode="stop_restore")
    upgrade.old_version, upgrade.size, upgrade.from_size, upgrade.partitions = "v1", 4, 2, 6
    upgrade.move(Phase.DONE, "v1 runs at 4")
    upgrades.put(upgrade)
    assert main(["upgrade", "orders", "--show", "--jobs", str(jobs)]) == 0
    shown = capsys.readouterr().out
    assert "rescale 2 -> 4, state to 6 partitions of orders (v1), upgrade up-20260101T000000000Z-0001" in shown, shown

    # an upgrade the loop or a person began to change the version keeps the size: it is an upgrade, as before
    other = Upgrade(id="up-20260101T000000000Z-0002", job="orders", to_version="v2", mode="stop_restore")
    other.old_version, other.size, other.from_size = "v1", 4, 4
    other.move(Phase.DONE, "v2 runs")
    upgrades.put(other)
    assert main(["upgrade", "orders", "--show", "--jobs", str(jobs)]) == 0
    shown = capsys.readouterr().out
    assert "upgrade up-20260101T000000000Z-0002 of orders to v2" in shown and "rescale" not in shown, shown


@pytest.mark.parametrize("mode", ["active", "passive"])
def test_a_dry_run_says_what_the_autoscaler_would_do_on_which_knob(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    jobs = declare(tmp_path, mode=mode, load=behind(time.time()))
    assert main(["apply", "--dry-run", "--jobs", str(jobs)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    if mode == "active":
        said = "orders: RESCALE - dp-20260101T000000000Z-0002 runs v1; autoscale on cores: scale up from 4 to 8: "
    else:
        said = "orders: NOTHING - dp-20260101T000000000Z-0002 runs v1, as desired; autoscale on cores (passive, not "
        said += "acted on): scale up from 4 to 8: "
    assert said in shown, shown
    assert "above the target 0.7; the backlog grew by" in shown, "the reason, with its figures"
    assert "(the state repartitioned to 8 partitions)" in shown, "past its 4 partitions: the state's new ones"
