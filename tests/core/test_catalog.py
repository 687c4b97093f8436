"""The catalogs (core/catalog/index.py over manifests and deployment records): property-based sequences of changes,
crashes between a change and its settle, writers that do not mark (by hand, a backup), a damaged or
deleted catalog; the invariant checked after every step on the stored object itself (each entry matches its
record, or the record is marked) and on what readers see (exactly what the records hold). Then threads racing
on one catalog, and the deployment index with its final heartbeats."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_plugin.core.catalog.index import DEAD_AFTER, Known, Mark
from airflow_plugin.core.catalog.snapshots import SnapshotEntry
from airflow_plugin.core.errors import NotFound, StoreUnavailable
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.layout import manifest_key, snapshot_catalog_key
from airflow_plugin.core.lease import default_holder
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.snapshots.lifecycle import set_pinned
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import LocalStorage
from tests.support.catalogs import listed, manifest, truth, write_unmarked
from tests.support.processes import ended_process

JOB = "orders"

OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "pin", "remove", "killed", "killed long ago", "unmarked", "damage", "drop"]),
        st.integers(0, 7),
    ),
    min_size=1,
    max_size=12,
)


def gone_holder() -> str:
    """A holder whose process of this host has just ended: its marks are dead at once. Made where it is used:
    pids wrap (32,768 here), so one taken at collection may belong to a live process by the time a test runs."""
    return f"{default_holder().rpartition(':')[0]}:{ended_process().key}"


def check_invariant(store: SnapshotStore) -> None:
    """On the stored catalog: every entry is the record's version, or the record is marked."""
    stored = store.catalog(JOB).stored()
    records = truth(store, JOB)
    assert stored is not None or not records, "a reader of a job with snapshots saves its catalog"
    versions, marks = stored or ({}, [])
    marked = {m.id for m in marks}
    for snapshot_id in set(records) | set(versions):
        expected = records[snapshot_id][2] if snapshot_id in records else None
        assert versions.get(snapshot_id) == expected or snapshot_id in marked, snapshot_id


def killed_writer(store: SnapshotStore, snapshot_id: str, holder: str, at: float) -> None:
    """What a writer killed after its change and before its settle leaves: its mark, and the changed manifest
    (pin toggled)."""
    index = store.catalog(JOB)
    index._swap(lambda state: type(state)(state.entries, [*state.marks, Mark(snapshot_id, holder, at)]))
    current = store.get(JOB, snapshot_id)
    version = store.storage.read_with_token(manifest_key(JOB, snapshot_id))[1]
    current.pinned = not current.pinned
    store.storage.replace(manifest_key(JOB, snapshot_id), current.to_json(), version)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_readers_see_exactly_what_the_manifests_hold_whatever_happened(ops: list[tuple[str, int]]) -> None:
    store = SnapshotStore(LocalStorage(Path(tempfile.mkdtemp(prefix="catalog-"))))
    for op, n in ops:
        ids = sorted(truth(store, JOB))
        target = ids[n % len(ids)] if ids else None
        if op == "add":
            store.add(manifest(JOB))
        elif op == "pin" and target:
            set_pinned(store, JOB, target, not truth(store, JOB)[target][1])
        elif op == "remove" and target:
            assert store.remove([(JOB, target, truth(store, JOB)[target][2])]) == []
        elif op == "killed" and target:
            killed_writer(store, target, default_holder(), time.time())  # still running, as far as anyone knows
        elif op == "killed long ago" and target:
            killed_writer(store, target, "someone@elsewhere:1", time.time() - DEAD_AFTER - 1)
        elif op == "unmarked":
            existed = store.catalog(JOB).stored() is not None
            write_unmarked(store.storage, manifest(JOB))  # written by hand: only a listing finds it
            view, differed = store.catalog(JOB).validate()
            assert len(differed) == int(existed) and listed(list(view.values())) == truth(store, JOB)
        elif op == "damage":
            store.storage.write(snapshot_catalog_key(JOB), b"\x1f\x8b not gzip")
        elif op == "drop":
            store.storage.delete([snapshot_catalog_key(JOB)])
        assert listed(store.list(JOB)) == truth(store, JOB), (op, n)
        check_invariant(store)
        marks = (store.catalog(JOB).stored() or ({}, []))[1]
        assert all(not m.dead(time.time()) for m in marks), "a dead mark was left"


def test_a_settle_after_another_writer_changed_the_same_record_keeps_theirs(tmp_path: Path) -> None:
    """Writer A changes a manifest; before A settles, B changes (or deletes) it and settles: A's settle must
    leave B's version (or nothing), not write its own older one back."""
    store = SnapshotStore(LocalStorage(tmp_path))
    index = store.catalog(JOB)
    made = manifest(JOB)
    key = manifest_key(JOB, made.id)
    with index.changing([made.id]) as known:  # A creates it...
        written = store.storage.create(key, made.to_json())
        known[made.id] = Known(None, written, SnapshotEntry.of(made, written))
        before_b = store.current(JOB, made.id)
        set_pinned(store, JOB, made.id, True)  # ... B pins it and settles first
    assert listed(store.list(JOB)) == truth(store, JOB) and truth(store, JOB)[made.id][1] is True
    assert before_b.version != truth(store, JOB)[made.id][2]

    with index.changing([made.id]) as known:  # A unpins it...
        current = store.current(JOB, made.id)
        made.pinned = False
        written = store.storage.replace(key, made.to_json(), current.version or "")
        known[made.id] = Known(current.version, written, SnapshotEntry.of(made, written))
        gone = store.current(JOB, made.id)
        assert store.remove([(JOB, made.id, gone.version)]) == []  # ... B deletes it and settles first
    assert truth(store, JOB) == {} and store.list(JOB) == []  # never resurrected
    versions, marks = index.stored()
    assert versions == {} and marks == []


def test_a_mark_of_a_process_that_is_gone_is_settled_at_once(tmp_path: Path) -> None:
    store = SnapshotStore(LocalStorage(tmp_path))
    made = manifest(JOB)
    store.add(made)
    killed_writer(store, made.id, gone_holder(), time.time())
    assert store.catalog(JOB).stored()[1] != []
    assert listed(store.list(JOB)) == truth(store, JOB)  # the reader settled it...
    versions, marks = store.catalog(JOB).stored()
    assert marks == [] and versions[made.id] == truth(store, JOB)[made.id][2]  # ... and dropped the mark


def test_writers_in_threads_never_lose_or_resurrect_an_entry(tmp_path: Path) -> None:
    store = SnapshotStore(LocalStorage(tmp_path))
    kept: list[str] = []
    removed: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        try:
            start.wait()
            mine = [manifest(JOB, pack=n * 10 + i) for i in range(3)]
            for made in mine:
                store.add(made)
            set_pinned(store, JOB, mine[0].id, True)
            doomed = store.current(JOB, mine[1].id)
            assert store.remove([(JOB, doomed.id, doomed.version)]) == []
            with pytest.raises(NotFound):
                set_pinned(store, JOB, doomed.id, True)  # a change never writes a deleted snapshot back
            kept.extend([mine[0].id, mine[2].id])
            removed.append(doomed.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    records = truth(store, JOB)
    assert set(records) == set(kept) and not set(removed) & set(records)
    assert listed(store.list(JOB)) == records
    check_invariant(store)
    assert store.catalog(JOB).stored()[1] == []  # every writer settled


class ReadOnly(LocalStorage):
    """A store the reader may not write to, as S3 answers AccessDenied."""

    def _refuse(self, *args: object) -> str:
        raise StoreUnavailable(f"refused to write {self.uri} (AccessDenied)")

    write = create = replace = _refuse  # type: ignore[assignment]


def test_a_reader_without_write_access_still_sees_the_truth(tmp_path: Path) -> None:
    writable = SnapshotStore(LocalStorage(tmp_path))
    for made in (manifest(JOB), manifest(JOB, pack=1)):
        write_unmarked(writable.storage, made)  # a store from before catalogs
    reader = SnapshotStore(ReadOnly(tmp_path))
    assert listed(reader.list(JOB)) == truth(writable, JOB)
    assert reader.catalog(JOB).stored() is None  # nothing could be saved, and nothing was


def test_deployments_are_listed_from_the_index_with_the_final_heartbeat_of_retired_ones(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    records = Deployments(storage)
    for n in range(5):
        deployment = Deployment(f"dp-{n}", JOB, "v1", f"/c/{n}")
        records.put(deployment)
        records.write_status(JOB, deployment.id, DeploymentStatus(State.STOPPED, time.time(), last_batch_id=n))
        if n < 4:
            deployment.retired_at = "2026-11-21T12:00:00Z"
            records.put(deployment)  # retired: its heartbeat is final, kept in the index
    records.write_status(JOB, "dp-4", DeploymentStatus(State.RUNNING, time.time(), last_batch_id=40))
    reader = Deployments(LocalStorage(tmp_path))
    assert [d.id for d in reader.list(JOB)] == [f"dp-{n}" for n in range(5)]
    (tmp_path / "jobs" / JOB / "deployments" / "dp-0" / "status.json").unlink()  # not read again
    assert reader.status(JOB, "dp-0").last_batch_id == 0 and reader.status(JOB, "dp-4").last_batch_id == 40
    assert reader.index(JOB).stored()[1] == []
