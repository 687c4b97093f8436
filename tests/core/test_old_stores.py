"""A store written by savepoints before catalogs, by that code itself (the parent of the commit that added
core/index.py, taken from this repository's history): read by this code it migrates on first use (each job's
catalogs are built from the manifests and records and saved), and every command answers as before. An old
writer that keeps writing after that is found by the commands that compare the catalog with a listing of
the manifests (list, prune, `catalog check`), which settle what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.layout import deployment_index_key, snapshot_catalog_key
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage
from tests.support.catalogs import listed, truth
from tests.support.synthetic import add_batch, write_checkpoint

REPO = Path(__file__).resolve().parents[2]
JOB = "orders"

OLD_WRITES = """
import json, sys, time
from airflow_plugin.core.jobs.deployments import Deployment, Deployments, DeploymentStatus, State
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.lifecycle import delete_snapshot, set_pinned
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage
store_uri, checkpoint, first = sys.argv[1], sys.argv[2], sys.argv[3] == "first"
store = SnapshotStore(open_storage(store_uri))
made = [create_snapshot(store, open_storage(checkpoint), SnapshotRequest(job="orders")).id for _ in range(3)]
records = Deployments(store.storage)
if first:
    set_pinned(store, "orders", made[0], True)
    delete_snapshot(store, "orders", made[1])
    for n, state in enumerate(["STOPPED", "RUNNING"]):
        retired = "2026-11-20T10:00:00Z" if n == 0 else None
        records.put(Deployment(f"dp-{n}", "orders", "v1", f"/c/{n}", retired_at=retired))
        records.write_status("orders", f"dp-{n}", DeploymentStatus(State(state), time.time(), last_batch_id=n))
else:  # it retires the running deployment and starts another
    old = records.get("orders", "dp-1")
    old.retired_at = "2026-11-21T10:00:00Z"
    records.write_status("orders", "dp-1", DeploymentStatus(State.STOPPED, time.time(), last_batch_id=1))
    records.put(old)
    records.put(Deployment("dp-2", "orders", "v1", "/c/2"))
    records.write_status("orders", "dp-2", DeploymentStatus(State.RUNNING, time.time(), last_batch_id=2))
print(json.dumps(made))
"""


@pytest.fixture(scope="module")
def old_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as it was before catalogs, from git."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.fail(f"git {' '.join(args)} failed: this test needs the repository's history: {done.stderr}")
        return done.stdout.strip()

    added = git("log", "--diff-filter=A", "--format=%H", "--", "airflow_plugin/core/index.py").splitlines()
    assert added, "no commit added airflow_plugin/core/index.py"
    root = tmp_path_factory.mktemp("old-savepoints")
    before = f"{added[-1]}^"
    archive = subprocess.run(["git", "archive", before, "airflow_plugin"], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    assert not (root / "airflow_plugin/core/index.py").exists()
    return root


def old_writer(old_code: Path, store: str, checkpoint: Path, *, first: bool) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(old_code)}
    args = [store, str(checkpoint), "first" if first else "later"]
    command = [sys.executable, "-c", OLD_WRITES, *args]
    done = subprocess.run(command, cwd=old_code, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> object:
    code = main([*args, "--json"])
    output = capsys.readouterr()
    assert code == 0, output.err
    return json.loads(output.out)


def test_a_store_written_before_catalogs(
    old_code: Path, s3_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", batches=2)
    made = old_writer(old_code, s3_store, checkpoint, first=True)
    store = SnapshotStore(open_storage(s3_store))
    assert (
        store.storage.stat(snapshot_catalog_key(JOB)) is None and store.storage.stat(deployment_index_key(JOB)) is None
    )

    rows = cli(capsys, "list", "--store", s3_store)
    assert [r["id"] for r in rows] == [made[0], made[2]] and [r["pinned"] for r in rows] == [True, False]
    assert store.storage.stat(snapshot_catalog_key(JOB)) is not None  # migrated on first use
    assert cli(capsys, "show", JOB, "--store", s3_store, "latest")["id"] == made[2]
    dry = cli(capsys, "restore", JOB, "--store", s3_store, "latest", "--to", str(tmp_path / "r"), "--dry-run")
    assert dry["resumes_at_batch"] == 2
    plan = cli(capsys, "prune", "--store", s3_store, "--savepoint-keep-last", "1", "--dry-run")
    assert plan["plan"]["summary"]["snapshots"] == 0  # the older one is pinned
    jobs = tmp_path / "jobs.toml"
    declared = f'store = "{s3_store}"\ncheckpoint_root = "{tmp_path}/c"\nversions.v1 = {{ application = "a.py" }}\n'
    jobs.write_text(f"[jobs.orders]\n{declared}")
    status = cli(capsys, "status", "--jobs", str(jobs), "--all")
    assert [(r["deployment"], r["state"]) for r in status] == [("dp-0", "STOPPED"), ("dp-1", "RUNNING")]
    assert store.storage.stat(deployment_index_key(JOB)) is not None

    # an older savepoints keeps writing: what compares with the manifests finds it and settles it
    add_batch(checkpoint, 2)
    later = old_writer(old_code, s3_store, checkpoint, first=False)
    report = cli(capsys, "catalog", "check", "--store", s3_store)
    assert report["jobs"][0]["differed"] == {"snapshots": later, "deployments": ["dp-1", "dp-2"]}
    status = cli(capsys, "status", "--jobs", str(jobs), "--all")
    states = [(r["deployment"], r["state"]) for r in status]
    assert states == [("dp-0", "STOPPED"), ("dp-1", "STOPPED"), ("dp-2", "RUNNING")]
    assert listed(store.list(JOB)) == truth(store, JOB)
    assert cli(capsys, "show", JOB, "--store", s3_store, "latest")["id"] == later[-1]
    rebuilt = cli(capsys, "catalog", "rebuild", "--store", s3_store)
    assert rebuilt["jobs"][0]["snapshots"] == 5 and rebuilt["jobs"][0]["deployments"] == 3
