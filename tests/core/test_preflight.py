"""The steps of an upgrade before the cutover, against a running v1, with real spark-submit applications:
the pre-flight on a live savepoint (v2 passes; `regrouped`, per country instead of per user, passes
Spark's own check and is blocked by the field-name comparison unless renames are allowed), and a
pre-started v2 driver in STANDBY that cannot be activated while v1 runs and is stopped by a rollback
that has no savepoint. v1 keeps running throughout and its checkpoint is untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from airflow_plugin.core.errors import Refused
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.savepoint import take_savepoint
from airflow_plugin.core.jobs.stop import stop
from airflow_plugin.core.records.deployment import Deployment, State
from airflow_plugin.core.records.manifest import Kind, Manifest, SnapshotStatus, Trigger
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.upgrades.launch import activate, prestart
from airflow_plugin.core.upgrades.preflight import (
    PreflightReport,
    UpgradeBlocked,
    compare_schemas,
    incomplete_state,
    preflight,
    schema_field_names,
)
from airflow_plugin.core.upgrades.rollback import rollback
from devtools.windowed import REPO, Feeder, batches, processed, wait_for, write_jobs_file

TOTALS_APPS = REPO / "spark_jobs/jobs/user_totals"


def _utf(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def test_missing_state_files_are_explained_as_an_incomplete_snapshot() -> None:
    manifest = Manifest(
        "sp-1", "orders", Kind.SAVEPOINT, Trigger.MANUAL, SnapshotStatus.COMPLETED, "/ck", "now", batch_id=35
    )
    spark = "[CANNOT_LOAD_STATE_STORE.CANNOT_READ_STREAMING_STATE_FILE] Error reading streaming state file of ..."
    detail = f"{spark} state/1/1/1.changelog does not exist."
    reason = incomplete_state(manifest, "CANNOT_LOAD_STATE_STORE", detail, spark)
    assert reason is not None and reason.startswith("the state of snapshot sp-1 is incomplete: its commits reach")
    assert "A sink that skipped batches as already written leaves exactly this" in reason and spark in reason
    assert incomplete_state(manifest, "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", "key schema", "key") is None


def test_schema_field_names_reads_key_and_value_schemas_through_the_binary_framing() -> None:
    def field(name: str, kind: object) -> dict[str, object]:
        return {"name": name, "type": kind, "nullable": True, "metadata": {}}

    window = {"type": "struct", "fields": [field("start", "timestamp")]}
    key = json.dumps(
        {"type": "struct", "fields": [field("window", window), field("user", "string")]}, separators=(",", ":")
    )
    value = json.dumps({"type": "struct", "fields": [field("count", "long")]}, separators=(",", ":"))
    data = b"v2\n" + _utf(key) + _utf(value)
    assert schema_field_names(data) == [["window", "window.start", "user"], ["count"]]
    assert schema_field_names(b"v2\n" + _utf(key.replace('"user"', '"country"')) + _utf(value))[0][-1] == "country"
    assert schema_field_names(b"garbage") == []


def _struct(*names: str) -> str:
    fields = [{"name": n, "type": "long", "nullable": True, "metadata": {}} for n in names]
    return json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))


def _v3(*variables: tuple[str, str, str]) -> bytes:
    """A transformWithState schema file (format v3): per state variable its name, key and value schema."""
    body = b"".join(_utf(name) + b"\0\0\0\0\0\x01" + _utf(_struct(k)) + _utf(_struct(v)) for name, k, v in variables)
    return _utf("v3") + len(variables).to_bytes(4, "big") + body


def test_transform_with_state_schemas_compare_by_name_in_any_variable_order() -> None:
    stored = {"state/0/_stateSchema/default": _v3(("count", "user", "c"), ("total", "user", "t"))}
    reordered = {"state/0/_stateSchema/default": _v3(("total", "user", "t"), ("count", "user", "c"))}
    renamed = {"state/0/_stateSchema/default": _v3(("count", "user", "events"), ("total", "user", "t"))}
    same = PreflightReport("j", "v2", "sp-1", 3)
    compare_schemas(same, stored, reordered)
    assert same.schemas_compared == 1 and same.renames == []
    changed = PreflightReport("j", "v2", "sp-1", 3)
    compare_schemas(changed, stored, renamed)
    assert [r.describe() for r in changed.renames] == [
        "state/0/_stateSchema/default: value of state variable 1 (c) -> (events)"
    ]


@contextmanager
def _running_v1(jobs_file: Path, name: str, rounds: int) -> Iterator[tuple[JobContext, SnapshotStore, Deployment]]:
    """Job `name` of `jobs_file` deployed at v1 (spark-submit) and through `rounds` rounds of input; stopped
    afterwards."""
    job = Settings(jobs_file=str(jobs_file)).resolve().job(name)
    store = job.store
    feed = Feeder(jobs_file.parent / "input")
    v1 = deploy(job, DeployRequest("v1"))
    try:
        for _ in range(rounds):
            feed.round()
        wait_for(lambda: processed(v1.checkpoint, feed.rounds), f"v1 to process {rounds} rounds")
        yield job, store, v1
    finally:
        stop(job, deployment_id=v1.id)


@pytest.mark.spark
@pytest.mark.slow
def test_preflight_passes_a_compatible_version_and_blocks_a_silent_regrouping(tmp_path: Path) -> None:
    with _running_v1(write_jobs_file(tmp_path, str(tmp_path / "store")), "windowed", rounds=3) as (job, store, v1):
        savepoint = take_savepoint(job, labels={"purpose": "upgrade"})
        commits_before = batches(v1.checkpoint, "commits")

        ok = preflight(job, savepoint.id, "v2")
        assert ok.passed, ok.reason
        assert ok.schemas_compared >= 1 and ok.renames == []
        ok.raise_if_blocked()

        blocked = preflight(job, savepoint.id, "regrouped")
        assert not blocked.passed and blocked.error_class is None  # Spark itself accepted it
        assert [r.schema_file for r in blocked.renames] and "user" in blocked.reason and "country" in blocked.reason
        with pytest.raises(UpgradeBlocked, match=r"regrouped.*not touched"):
            blocked.raise_if_blocked()

        allowed = preflight(job, savepoint.id, "regrouped", allow_renames=True)
        assert allowed.passed and allowed.renames

        standby = prestart(job, "v2")
        waiting = Deployments(store.storage).status(job.name, standby.id)
        assert waiting is not None and (waiting.state, waiting.last_batch_id) == (State.STANDBY, None)
        # it warmed up on its own query's first batch, which its status does not count as the deployment's
        assert "standby: warm-up query ran its batch 0" in Path(standby.launcher["log"]).read_text(errors="replace")
        with pytest.raises(Refused, match=f"already has deployment {v1.id} in state RUNNING"):
            activate(job, standby.id, savepoint.id)
        with pytest.raises(Refused, match=f"already has a pre-started deployment {standby.id}"):
            prestart(job, "v3")
        assert [d.id for d in Deployments(store.storage).list(job.name)] == [v1.id, standby.id]
        cancelled = rollback(job, None)
        assert cancelled.action == "none" and cancelled.replaced == [standby.id]
        assert Deployments(store.storage).status(job.name, standby.id).state is State.STOPPED

        status = Deployments(store.storage).status(job.name, v1.id)
        assert status is not None and status.state is State.RUNNING
        assert batches(v1.checkpoint, "commits")[: len(commits_before)] == commits_before
        leftovers = list((tmp_path / "checkpoints" / job.name / "_preflight").rglob("*"))
        assert [p for p in leftovers if p.is_file()] == []
        assert [d.id for d in Deployments(store.storage).list(job.name)] == [v1.id, standby.id]


@pytest.mark.spark
@pytest.mark.slow
def test_preflight_compares_transform_with_state_schemas_by_name(tmp_path: Path) -> None:
    """transformWithState keeps its schemas in Spark's format v3, referenced by the operator metadata;
    Spark's check ignores their names as well. The example job user_totals keyed by country instead of
    user is blocked; the same version passes with its schema compared."""
    jobs_file = write_jobs_file(
        tmp_path, str(tmp_path / "store"), job="totals", apps=TOTALS_APPS, versions=("v1", "regrouped")
    )
    with _running_v1(jobs_file, "totals", rounds=2) as (job, store, v1):
        savepoint = take_savepoint(job)
        assert any("/_stateSchema/" in f.path for f in savepoint.files)

        same = preflight(job, savepoint.id, "v1")
        assert same.passed, same.reason
        assert same.schemas_compared == 1 and same.renames == []

        blocked = preflight(job, savepoint.id, "regrouped")
        assert not blocked.passed and blocked.error_class is None  # Spark itself accepted it
        assert [r.schema_file for r in blocked.renames] == ["state/0/_stateSchema/default"]
        assert "key (user) -> (country)" in blocked.reason, blocked.reason
        status = Deployments(store.storage).status(job.name, v1.id)
        assert status is not None and status.state is State.RUNNING
