"""`savepoints metrics`: every figure against the store's own truth (records, heartbeats, manifests, a listing of
the stored objects), in OpenMetrics text that prometheus_client's parser reads back, Prometheus' naming rules,
and a scrape's cost independent of the history's length."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from airflow_plugin.cli import main
from airflow_plugin.core import metrics
from airflow_plugin.core.autoscale.decide import Rescale
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.spec import load_jobs
from airflow_plugin.core.layout import BLOBS, PACKS
from airflow_plugin.core.lease import acquire
from airflow_plugin.core.reconcile.record import Reconciled, Restart
from airflow_plugin.core.reconcile.record import write as write_reconciled
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import Kind, Manifest, SnapshotStatus, Trigger, new_snapshot_id
from airflow_plugin.core.retention.prune import prune
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import LocalStorage, open_storage
from airflow_plugin.core.timestamps import utc_now
from tests.support.jobs import write_jobs
from tests.support.synthetic import add_batch, write_checkpoint

PERIODS = 'retention.checkpoint = { keep_last = 3, period = "30m" }\nretention.savepoint = { period = "1d" }'


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value, parsed as Prometheus would (strict OpenMetrics)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


@pytest.fixture
def store_with_history(tmp_path: Path) -> tuple[Path, SnapshotStore]:
    declared = '\ndesired = { version = "v2" }\nrestart = { attempts = 3 }\nautoscale = { max = 4 }'
    jobs = write_jobs(tmp_path, extra=PERIODS + declared + '\nspark_master = "local[3]"')
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    restarted = Reconciled("orders", restarts=[Restart(time.time() - 60, "dp-x", "LOST", 1, "dp-y")])
    restarted.restarts.append(Restart(time.time() - 7200, "dp-w", "FAILED", 1, "dp-x"))  # outside the window
    # the autoscaler: two rescales, the job at its max and behind, scale-ups held (its size: the running
    # deployment's master, below)
    restarted.rescales = [
        Rescale(time.time() - 900, 1, 2, "behind", {}),
        Rescale(time.time() - 600, 2, 4, "behind", {}),
    ]
    restarted.recommendation = {"at": time.time(), "direction": "keep", "size": 4, "current": 4, "reason": "at max"}
    restarted.recommendation["behind_at_max"] = True
    restarted.scale_up_held = "the scale-up from 2 to 4 did not raise the processing rate"
    restarted.scale_up_held_under = load_jobs(str(jobs))["orders"].fingerprint
    restarted.rescales_total = 2
    write_reconciled(store.storage, restarted)
    checkpoint = write_checkpoint(tmp_path / "ckpt", batches=3)
    records = Deployments(store.storage)
    running = Deployment("dp-20260101T000000000Z-aaaa", "orders", "v2", str(checkpoint), master="local[4]")
    retired = Deployment("dp-20250101T000000000Z-bbbb", "orders", "v1", str(tmp_path / "old"), retired_at=utc_now())
    for deployment in (retired, running):
        records.put(deployment)
    records.write_status("orders", retired.id, DeploymentStatus(State.STOPPED, time.time() - 999, last_batch_id=1))
    records.write_status(
        "orders",
        running.id,
        DeploymentStatus(
            State.RUNNING,
            time.time() - 4,
            last_batch_id=2,
            batch_duration_ms=1500,
            rows_per_second=12.5,
            input_rows_total=750,
            kafka_lag=42,
            state_operators=[{"name": "stateStoreSave", "rows": 77, "memory_bytes": 1000, "batch_id": 2}],
            gate={"column": "window_end", "role": "blue", "until": 60_000, "dropped": 12, "upgrade": "up-1"},
        ),
    )
    progress = ({"name": "stateStoreSave", "rows": 77, "batch_id": 2},)
    create_snapshot(store, LocalStorage(checkpoint), SnapshotRequest("orders", Kind.CHECKPOINT))
    add_batch(checkpoint, 3)
    create_snapshot(
        store, LocalStorage(checkpoint), SnapshotRequest("orders", deployment=running.id, state_progress=progress)
    )
    failed = Manifest(
        new_snapshot_id(Kind.SAVEPOINT), "orders", Kind.SAVEPOINT, Trigger.MANUAL, SnapshotStatus.FAILED, "x", utc_now()
    )
    failed.completed_at = utc_now()
    store.add(failed)
    (store.storage.root / "blobs" / "ff").mkdir(parents=True)  # an object no snapshot references: awaiting gc
    (store.storage.root / "blobs" / "ff" / ("f" * 64)).write_bytes(b"orphan" * 100)
    prune(store)  # records the store's usage (the orphan is younger than the grace period: kept)
    acquire(store.storage, "orders", "someone@host:1", "deploy", ttl=60).keep()
    return jobs, store


def test_every_figure_matches_the_store(store_with_history: tuple[Path, SnapshotStore]) -> None:
    jobs, store = store_with_history
    text = metrics.render(metrics.observe(Settings(jobs_file=str(jobs)).resolve())).decode()
    assert text.endswith("# EOF\n")
    found = samples(text)
    dep = {"job": "orders", "deployment": "dp-20260101T000000000Z-aaaa", "version": "v2"}

    assert value(found, "savepoints_job_up", job="orders") == 1
    assert value(found, "savepoints_reconcile_restarts_total", job="orders") == 2
    assert value(found, "savepoints_reconcile_restarts_left", job="orders") == 2, "one restart in the last hour"
    assert value(found, "savepoints_reconcile_desired_running", job="orders") == 1
    # the autoscaler's: the size from the running deployment's master (local[4]), not the jobs file's (local[3])
    assert value(found, "savepoints_autoscale_size", job="orders") == 4
    assert value(found, "savepoints_autoscale_recommended_size", job="orders") == 4
    assert value(found, "savepoints_autoscale_max_size", job="orders") == 4
    assert value(found, "savepoints_autoscale_behind_at_max", job="orders") == 1
    assert value(found, "savepoints_autoscale_rescales_total", job="orders") == 2
    assert value(found, "savepoints_autoscale_scale_up_held", job="orders") == 1
    assert value(found, "savepoints_deployment_state", **dep, state="RUNNING") == 1
    assert value(found, "savepoints_deployment_state", **dep, state="LOST") == 0
    assert not [k for k in found if ("deployment", "dp-20250101T000000000Z-bbbb") in k[1]], "a retired one is left out"
    assert 4 <= value(found, "savepoints_deployment_heartbeat_age_seconds", **dep) < 30
    assert value(found, "savepoints_deployment_last_committed_batch", **dep) == 2
    assert value(found, "savepoints_deployment_batch_duration_seconds", **dep) == 1.5
    assert value(found, "savepoints_deployment_rows_per_second", **dep) == 12.5
    assert value(found, "savepoints_deployment_input_rows_total", **dep) == 750
    assert value(found, "savepoints_deployment_kafka_lag_records", **dep) == 42
    assert value(found, "savepoints_deployment_state_rows", **dep, operator="0:stateStoreSave") == 77
    assert value(found, "savepoints_deployment_gate", **dep, role="blue") == 1
    assert value(found, "savepoints_deployment_gate_dropped_rows", **dep) == 12

    manifests = {
        m.kind: m for m in (store.get("orders", e.id) for e in store.list("orders")) if m.status.value == "COMPLETED"
    }
    for kind, manifest in manifests.items():
        labels = {"job": "orders", "kind": str(kind)}
        assert value(found, "savepoints_last_snapshot_batch", **labels) == manifest.batch_id
        assert value(found, "savepoints_last_snapshot_size_bytes", **labels) == manifest.total_bytes
        assert value(found, "savepoints_last_snapshot_uploaded_bytes", **labels) == manifest.uploaded_bytes
        assert 0 <= value(found, "savepoints_last_snapshot_age_seconds", **labels) < 60
        state_bytes = sum(f.size for f in manifest.files if f.path.startswith("state/0/") and "_metadata" not in f.path)
        assert value(found, "savepoints_last_snapshot_state_size_bytes", **labels, operator="0:stateStoreSave") == (
            state_bytes
        )
    savepoint = manifests[Kind.SAVEPOINT]
    assert (
        value(found, "savepoints_last_snapshot_state_rows", job="orders", kind="savepoint", operator="0:stateStoreSave")
        == 77
    )
    assert (
        "savepoints_last_snapshot_state_rows",
        frozenset({"job": "orders", "kind": "checkpoint", "operator": "0:stateStoreSave"}.items()),
    ) not in found
    assert savepoint.state[0]["skew"]["ratio"] == 1.0  # two partitions of the same size
    assert value(found, "savepoints_snapshot_period_seconds", job="orders", kind="checkpoint") == 1800
    assert value(found, "savepoints_snapshot_period_seconds", job="orders", kind="savepoint") == 86400
    assert value(found, "savepoints_failed_snapshots", job="orders") == 1
    assert value(found, "savepoints_last_failed_snapshot_timestamp_seconds", job="orders") == pytest.approx(
        time.time(), abs=60
    )

    lease = json.loads(store.storage.read("jobs/orders/lease.json"))
    assert value(found, "savepoints_lease_ttl_seconds", job="orders", operation="deploy") == lease["ttl_s"]
    assert 0 <= value(found, "savepoints_lease_age_seconds", job="orders", operation="deploy") < 60
    assert value(found, "savepoints_lease_expired", job="orders", operation="deploy") == 0

    objects = [o for o in (*store.storage.list(BLOBS), *store.storage.list(PACKS))]
    referenced = {key for e in store.list() for key in e.objects}
    where = {"store": store.uri}
    assert value(found, "savepoints_store_objects", **where) == len(objects)
    assert value(found, "savepoints_store_size_bytes", **where) == sum(o.size for o in objects)
    assert (
        value(found, "savepoints_store_unreferenced_size_bytes", **where)
        == 600
        == sum(o.size for o in objects if o.key not in referenced)
    )

    # naming: lower snake case under savepoints_, base units as suffixes, counters end in _total
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("savepoints_") and family.name == family.name.lower()
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples)


def test_the_command_prints_it_and_a_scrape_costs_the_same_at_any_history(
    store_with_history: tuple[Path, SnapshotStore], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    jobs, store = store_with_history
    assert main(["metrics", "--jobs", str(jobs)]) == 0
    printed = capsys.readouterr().out
    assert "savepoints_deployment_state{" in printed and printed.endswith("# EOF\n")

    reads: list[str] = []
    for name in ("read", "read_with_token", "read_if_changed"):
        original = getattr(LocalStorage, name)
        monkeypatch.setattr(
            LocalStorage, name, lambda self, key, *a, _o=original, **k: reads.append(key) or _o(self, key, *a, **k)
        )

    def scrape() -> int:
        reads.clear()
        metrics.observe(Settings(jobs_file=str(jobs)).resolve())
        return len(reads)

    before = scrape()
    checkpoint = Path(store.get("orders", "latest").source)
    for batch in range(4, 24):  # twenty more snapshots
        add_batch(checkpoint, batch)
        create_snapshot(store, LocalStorage(checkpoint), SnapshotRequest("orders", Kind.CHECKPOINT))
    assert scrape() == before, reads  # the catalog, the index, heartbeats, the lease, the usage: no manifest
    assert not [key for key in reads if key.endswith("manifest.json")]


def test_a_store_that_cannot_be_read_is_a_job_down(tmp_path: Path) -> None:
    jobs = write_jobs(tmp_path, extra='store = "s3://no-such-bucket-here/x"')
    monkeypatched = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    with pytest.MonkeyPatch.context() as env:
        for key, item in monkeypatched.items():
            env.setenv(key, item)
        env.setenv("AWS_MAX_ATTEMPTS", "1")
        found = samples(metrics.render(metrics.observe(Settings(jobs_file=str(jobs)).resolve())).decode())
    assert value(found, "savepoints_job_up", job="orders") == 0


RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus"


def test_the_alert_rules_pass_promtool_and_name_only_exported_metrics(
    store_with_history: tuple[Path, SnapshotStore],
) -> None:
    """The example rules load (`promtool check rules`), each alert fires on the series it is for and not on
    healthy ones (`promtool test rules`), and every metric they name is one `savepoints metrics` exports."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make prometheus` installs Debian's prometheus package", pytrace=False)
    for command in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        result = subprocess.run([promtool, *command], cwd=RULES, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
    jobs, _ = store_with_history
    text = metrics.render(metrics.observe(Settings(jobs_file=str(jobs)).resolve())).decode()
    exported = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    expressions = [line for line in (RULES / "alerts.yml").read_text().splitlines() if "expr:" in line]
    named = set(re.findall(r"\bsavepoints_[a-z_]+", "\n".join(expressions)))
    assert named and named <= exported, named - exported
