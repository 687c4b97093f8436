"""health.py directly: the one health rule (fresh heartbeat, K new batches since the start or restore,
no error) as a pure verdict, and `check_health` reading it from a store."""

from __future__ import annotations

import io
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from airflow_plugin.cli.render import status_table
from airflow_plugin.core.errors import NotFound
from airflow_plugin.core.jobs.context import JobContext
from airflow_plugin.core.jobs.deployments import Deployments, describe
from airflow_plugin.core.jobs.health import Verdict, assess, check_health, target_batch
from airflow_plugin.core.jobs.spec import JobSpec
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import LocalStorage
from tests.support.processes import gone_handle

NOW = 1_800_000_000.0


def _deployment(restored_batch_id: int | None = None, **launcher: object) -> Deployment:
    return Deployment("dp-1", "orders", "v2", "/ck", restored_batch_id=restored_batch_id, launcher=dict(launcher))


def test_the_target_batch_counts_from_the_restored_batch_or_a_fresh_start() -> None:
    assert target_batch(_deployment(restored_batch_id=41), 3) == 44  # resumes at 42: 42, 43, 44
    assert target_batch(_deployment(), 3) == 2  # a fresh start: 0, 1, 2
    assert target_batch(_deployment(restored_batch_id=41), 0) == 42  # at least one batch, always


@pytest.mark.parametrize(
    ("status", "verdict", "reason"),
    [
        (DeploymentStatus(State.RUNNING, NOW - 1, last_batch_id=44), Verdict.HEALTHY, "batch 44 committed"),
        (DeploymentStatus(State.RUNNING, NOW - 1, last_batch_id=43), Verdict.WAITING, "waiting for batch 44"),
        (DeploymentStatus(State.STARTING, NOW - 1), Verdict.WAITING, "no batch yet"),
        (None, Verdict.WAITING, "is STARTING"),
        (
            DeploymentStatus(State.FAILED, NOW - 1, last_batch_id=50, error_class="BOOM", error_message="sink"),
            Verdict.UNHEALTHY,
            "FAILED (BOOM: sink)",
        ),
        (DeploymentStatus(State.RUNNING, NOW - 31, last_batch_id=50), Verdict.UNHEALTHY, "LOST"),
        (DeploymentStatus(State.STOPPED, NOW - 1, last_batch_id=50), Verdict.UNHEALTHY, "STOPPED, not running"),
    ],
)
def test_verdicts(status: DeploymentStatus | None, verdict: Verdict, reason: str) -> None:
    deployment = _deployment(restored_batch_id=41)
    deployment.created_at = "2099-01-01T00:00:00.000Z"  # no heartbeat yet, but just launched: STARTING
    health = assess(deployment, status, min_batches=3, heartbeat_timeout=30, now=NOW)
    assert health.verdict is verdict and reason in health.reason
    assert health.to_dict()["verdict"] == str(verdict) and health.target_batch_id == 44


def test_a_driver_whose_process_is_gone_is_unhealthy_at_once() -> None:
    gone = _deployment(**gone_handle())
    status = DeploymentStatus(State.RUNNING, NOW - 1, last_batch_id=99)
    assert assess(gone, status, min_batches=1, heartbeat_timeout=30, now=NOW).verdict is Verdict.UNHEALTHY


def test_a_driver_its_cluster_still_has_queued_waits_however_long_it_has_been() -> None:
    queued = replace(_deployment(), created_at="2020-01-01T00:00:00.000Z")  # no heartbeat for years
    assert assess(queued, None, min_batches=1, heartbeat_timeout=30, now=NOW).verdict is Verdict.UNHEALTHY  # LOST
    waiting = assess(queued, None, min_batches=1, heartbeat_timeout=30, now=NOW, observed=State.STARTING)
    assert waiting.verdict is Verdict.WAITING and "STARTING" in waiting.reason, waiting


def test_check_health_reads_the_store(tmp_path: Path) -> None:
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    job = JobContext(JobSpec.undeclared("orders"), store)
    records = Deployments(store.storage)
    records.put(_deployment(restored_batch_id=1))
    records.write_status("orders", "dp-1", DeploymentStatus(State.RUNNING, time.time(), last_batch_id=3))
    assert check_health(job, "dp-1", min_batches=2).verdict is Verdict.HEALTHY
    assert check_health(job, "dp-1", min_batches=3).verdict is Verdict.WAITING
    with pytest.raises(NotFound, match="deployment dp-9 of job orders does not exist"):
        check_health(job, "dp-9", min_batches=1)


@pytest.mark.parametrize(
    ("lag", "first", "verdict", "reason"),
    [
        (400, 900, Verdict.HEALTHY, "Kafka lag 400 (first batch 900)"),
        (0, 0, Verdict.HEALTHY, "Kafka lag 0"),  # caught up from the start
        (900, 900, Verdict.WAITING, "its Kafka lag 900 has not fallen below 900"),
        (1500, 900, Verdict.WAITING, "its Kafka lag 1500 has not fallen below 900"),  # falling behind
    ],
)
def test_the_kafka_lag_must_fall_when_asked(lag: int, first: int, verdict: Verdict, reason: str) -> None:
    status = DeploymentStatus(State.RUNNING, NOW - 1, last_batch_id=44, kafka_lag=lag, kafka_lag_first=first)
    deployment = _deployment(restored_batch_id=41)
    health = assess(deployment, status, min_batches=3, heartbeat_timeout=30, lag_must_fall=True, now=NOW)
    assert health.verdict is verdict and reason in health.reason
    assert health.kafka_lag == lag and health.kafka_lag_first == first
    # batches alone decide when the lag is not asked for, and for a job without Kafka (no lag reported)
    assert assess(deployment, status, min_batches=3, heartbeat_timeout=30, now=NOW).verdict is Verdict.HEALTHY
    no_kafka = DeploymentStatus(State.RUNNING, NOW - 1, last_batch_id=44)
    assert assess(deployment, no_kafka, min_batches=3, heartbeat_timeout=30, lag_must_fall=True, now=NOW).verdict is (
        Verdict.HEALTHY
    )


def test_a_deployment_whose_sink_skips_its_batches_is_unhealthy_and_shown_so() -> None:
    """Batches committed, Kafka lag 0, heartbeat fresh: what a fresh deployment onto an earlier deployment's
    file sink looks like, except that its batches read records and processed none."""
    skipping = {"first": 1, "last": 35, "batches": 35, "streak": 35, "records": 3500}
    status = DeploymentStatus(
        State.RUNNING,
        NOW - 1,
        last_batch_id=44,
        kafka_lag=0,
        kafka_lag_first=0,
        sink="FileSink[file:/out]",
        sources=["KafkaV2[Subscribe[events]]"],
        unprocessed=skipping,
    )
    deployment = _deployment(restored_batch_id=41)
    health = assess(deployment, status, min_batches=3, heartbeat_timeout=30, lag_must_fall=True, now=NOW)
    assert health.verdict is Verdict.UNHEALTHY
    assert "commits batches it does not run: batches 1..35 advanced their sources (3500 Kafka records" in health.reason
    row = describe(deployment, status, State.RUNNING)
    assert row["state"] == "RUNNING" and "skipped them as already written" in row["unhealthy"]
    console = Console(width=240, record=True, file=io.StringIO())
    console.print(status_table([row]))
    assert "RUNNING UNHEALTHY" in console.export_text()
    healthy = replace(status, unprocessed={**skipping, "streak": 0})
    assert assess(deployment, healthy, min_batches=3, heartbeat_timeout=30, now=NOW).verdict is Verdict.HEALTHY
    assert describe(deployment, healthy, State.RUNNING)["unhealthy"] is None
