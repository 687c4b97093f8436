"""A create reads what the store holds (the earlier manifests whose contents it reuses) only once its IN_PROGRESS
manifest is written: the rule a delete and a prune keep by (records/manifest.py `in_flight`, snapshots/lifecycle.py
`delete_snapshot`, retention/plan.py). A create that read them first, while it planned its restart point, and a
`savepoint delete` of the snapshot it read in that window (which saw no create in flight and deleted the objects
only that snapshot held) committed a COMPLETED snapshot referencing deleted objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_plugin.core.snapshots import create as create_module
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.lifecycle import delete_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import LocalStorage
from tests.support.synthetic import add_batch, write_checkpoint


def test_a_delete_during_a_creates_planning_leaves_the_new_snapshot_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2)
    first = create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job="orders"), concurrency=2)
    add_batch(ckpt, 2)  # new files: their contents are stored by the second snapshot only
    second = create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job="orders"), concurrency=2)
    assert first.id != second.id

    original = create_module._restart_point
    deleted: list[dict[str, object]] = []

    def planning(*args: object, **kwargs: object) -> object:
        # a person deletes the newest snapshot while the next create plans (before its IN_PROGRESS manifest)
        if not deleted:
            deleted.append(delete_snapshot(store, "orders", second.id))
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(create_module, "_restart_point", planning)
    third = create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job="orders"), concurrency=2)

    assert deleted and deleted[0]["deleted_blobs"], deleted  # the delete saw nothing in flight
    report = verify_snapshot(store, "orders", third.id)
    assert report.ok, report.problems  # fails: `third` references objects the delete removed
