"""Retention: the pure planner rule by rule, property-based safety over generated histories (blobs, packs,
repacks and their markers), execution on real stores (verify afterwards), a prune racing a create, a
prune killed with SIGKILL while it repacks and deletes, the CLI. Over 300 lines: one contract, tested as one."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_plugin.cli import main
from airflow_plugin.core.catalog.snapshots import SnapshotEntry
from airflow_plugin.core.errors import InvalidInput
from airflow_plugin.core.jobs.context import JobContext
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.spec import JobSpec
from airflow_plugin.core.layout import pack_key, retired_key
from airflow_plugin.core.parallel import run_parallel
from airflow_plugin.core.records.deployment import Deployment, State
from airflow_plugin.core.records.deployment import DeploymentStatus as Heartbeat
from airflow_plugin.core.records.manifest import (
    FileEntry,
    Kind,
    Manifest,
    SnapshotStatus,
    Trigger,
    blob_key,
    new_snapshot_id,
)
from airflow_plugin.core.retention.plan import Observed, ObservedDeployment, plan
from airflow_plugin.core.retention.policy import KindPolicy, OnCancellation, RetentionPolicy, parse_policy
from airflow_plugin.core.retention.prune import execute, observe, prune, retain_checkpoints
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import LocalStorage, ObjectInfo, Storage, open_storage
from tests.support.synthetic import add_batch, tree, write_checkpoint

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
HOUR = 3600.0
ROOT = Path(__file__).resolve().parents[2]


def sha(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


PACK_SIZE = 16


def pack(i: int) -> str:
    return pack_key(f"{i:032x}")


def location(n: int) -> tuple[str, int]:
    """Content n: odd ones packed (pack n // 4, at offset n % PACK_SIZE), even ones single blobs."""
    return (pack(n // 4), n % PACK_SIZE) if n % 2 else (blob_key(sha(n)), 0)


def stored_objects(store: SnapshotStore) -> set[str]:
    return {i.key for i in [*store.storage.list("blobs/"), *store.storage.list("packs/")]}


def referenced_objects(store: SnapshotStore) -> set[str]:
    return {key for m in store.list() for key in m.objects}


def snap(
    job: str = "orders",
    kind: Kind = Kind.SAVEPOINT,
    status: SnapshotStatus = SnapshotStatus.COMPLETED,
    age_h: float = 1.0,
    *,
    pinned: bool = False,
    files: tuple[int, ...] = (),
    deployment: str | None = None,
) -> SnapshotEntry:
    """A snapshot as its catalog lists it (the planner's view)."""
    created = NOW - timedelta(hours=age_h)
    manifest = Manifest(
        id=new_snapshot_id(kind, created),
        job=job,
        kind=kind,
        trigger=Trigger.MANUAL,
        status=status,
        source="/ckpt",
        created_at=created.isoformat().replace("+00:00", "Z"),
        pinned=pinned,
        deployment=deployment,
        files=[FileEntry(f"f{n}", 1, sha(n), 0.0, *location(n)) for n in files],
    )
    return SnapshotEntry.of(manifest, f"v-{manifest.id}")


def blob(n: int, age_h: float = 10.0) -> ObjectInfo:
    """The object holding content n (a pack holds others too)."""
    key = location(n)[0]
    return ObjectInfo(key, PACK_SIZE if key.endswith(".pack") else 1, (NOW - timedelta(hours=age_h)).timestamp())


def deleted_ids(p: Any) -> set[str]:
    return {a.target for a in p.snapshots}


# ---------------------------------------------------------------- the planner, rule by rule


def test_keep_last_per_job_and_kind() -> None:
    sps = [snap(age_h=h) for h in (5, 4, 3, 2, 1)]
    cks = [snap(kind=Kind.CHECKPOINT, age_h=h) for h in (5, 4, 3, 2, 1)]
    other = [snap(job="billing", age_h=h) for h in (5, 4)]
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=2), checkpoint=KindPolicy(keep_last=3))
    p = plan(Observed(tuple(sps + cks + other)), policy, NOW)
    assert deleted_ids(p) == {m.id for m in sps[:3]} | {m.id for m in cks[:2]}
    assert all("beyond the newest" in a.reason for a in p.snapshots)


def test_max_age_and_the_newest_completed_is_always_kept() -> None:
    old = [snap(age_h=h) for h in (100, 90, 80)]
    policy = RetentionPolicy(savepoint=KindPolicy(max_age_s=HOUR))
    p = plan(Observed(tuple(old)), policy, NOW)
    assert deleted_ids(p) == {old[0].id, old[1].id}
    assert [k.snapshot for k in p.kept] == [old[2].id] and "newest COMPLETED" in p.kept[0].reason


def test_pinned_is_never_deleted_and_does_not_count() -> None:
    ms = [snap(age_h=5, pinned=True), snap(age_h=4), snap(age_h=3), snap(age_h=2, pinned=True), snap(age_h=1)]
    p = plan(Observed(tuple(ms)), RetentionPolicy(savepoint=KindPolicy(keep_last=1, max_age_s=1)), NOW)
    assert deleted_ids(p) == {ms[1].id, ms[2].id}


def test_snapshot_a_live_deployment_was_restored_from_is_kept() -> None:
    ms = [snap(age_h=3), snap(age_h=2), snap(age_h=1)]
    deployments = (
        ObservedDeployment("orders", "dp-1", "RUNNING", "/c1", restored_from=ms[0].id),
        ObservedDeployment("orders", "dp-2", "STOPPED", "/c2", restored_from=ms[1].id),
    )
    p = plan(Observed(tuple(ms), deployments), RetentionPolicy(savepoint=KindPolicy(keep_last=1)), NOW)
    assert deleted_ids(p) == {ms[1].id}
    assert "dp-1 (RUNNING) was restored from it" in p.kept[0].reason


def test_failed_and_abandoned_in_progress_go_after_their_grace_period() -> None:
    ms = [
        snap(status=SnapshotStatus.FAILED, age_h=30),
        snap(status=SnapshotStatus.FAILED, age_h=2),
        snap(status=SnapshotStatus.IN_PROGRESS, age_h=7),
        snap(status=SnapshotStatus.IN_PROGRESS, age_h=1),
        snap(status=SnapshotStatus.FAILED, age_h=50, pinned=True),
    ]
    p = plan(Observed(tuple(ms)), RetentionPolicy(), NOW)
    assert deleted_ids(p) == {ms[0].id, ms[2].id}
    reasons = {a.target: a.reason for a in p.snapshots}
    assert "FAILED" in reasons[ms[0].id] and "abandoned" in reasons[ms[2].id]


def test_blobs_unreferenced_by_remaining_snapshots_and_older_than_grace() -> None:
    doomed, kept = snap(age_h=5, files=(1, 2, 6)), snap(age_h=1, files=(2, 3))
    blobs = (blob(1), blob(2), blob(4), blob(5, age_h=0.1), blob(6))
    p = plan(Observed((doomed, kept), blobs=blobs), RetentionPolicy(savepoint=KindPolicy(keep_last=1)), NOW)
    # pack 0 holds contents 1 and 3: 3 is still referenced, so the pack stays, and is repacked (15/16 unused)
    assert sorted(p.blob_keys) == sorted([blob(4).key, blob(6).key])
    assert [a.target for a in p.repacks] == [pack(0)] and "94% of its 16 bytes" in p.repacks[0].reason
    assert any("younger than 1h" in note for note in p.notes)  # pack 1 (content 5)


def test_a_pack_goes_when_none_of_its_contents_is_referenced_and_its_marker_restarts_the_grace() -> None:
    doomed, kept = snap(age_h=5, files=(1, 3, 5)), snap(age_h=1, files=(2,))
    fresh_marker = ObjectInfo(retired_key(pack(1)), 0, (NOW - timedelta(minutes=5)).timestamp())
    stale_marker = ObjectInfo(retired_key(pack(7)), 0, (NOW - timedelta(hours=3)).timestamp())  # its pack is gone
    blobs = (blob(1), blob(2), blob(5), fresh_marker, stale_marker)
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=1))
    p = plan(Observed((doomed, kept), blobs=blobs), policy, NOW)
    # pack 0 (contents 1, 3) goes; pack 1 (content 5) is old but was emptied by a repack 5 minutes ago
    assert p.blob_keys == [pack(0), retired_key(pack(7))]
    later = plan(Observed((doomed, kept), blobs=blobs), policy, NOW + timedelta(hours=1))
    assert later.blob_keys == [pack(0), pack(1), retired_key(pack(1)), retired_key(pack(7))]  # markers last
    assert later.repacks == []


def test_nothing_is_repacked_while_a_snapshot_is_in_flight() -> None:
    ms = (snap(age_h=5, files=(1,)), snap(age_h=1, files=(3,)), snap(status=SnapshotStatus.IN_PROGRESS, age_h=0.5))
    p = plan(Observed(ms, blobs=(blob(1),)), RetentionPolicy(savepoint=KindPolicy(keep_last=1)), NOW)
    assert deleted_ids(p) == {ms[0].id} and p.actions == p.snapshots
    assert "in flight" in p.notes[0]


def test_no_blob_is_deleted_while_a_snapshot_is_in_flight() -> None:
    ms = (snap(age_h=5, files=(1,)), snap(age_h=1), snap(status=SnapshotStatus.IN_PROGRESS, age_h=0.5))
    p = plan(Observed(ms, blobs=(blob(1), blob(9))), RetentionPolicy(savepoint=KindPolicy(keep_last=1)), NOW)
    assert deleted_ids(p) == {ms[0].id} and p.blob_keys == []
    assert "in flight" in p.notes[0] and ms[2].id in p.notes[0]


def test_retired_deployments_checkpoints_retain_or_delete_on_cancellation() -> None:
    retired = (NOW - timedelta(days=2)).isoformat()
    ds = (
        ObservedDeployment("orders", "dp-old", "STOPPED", "/c/old", retired_at=retired),
        ObservedDeployment("orders", "dp-live", "RUNNING", "/c/live"),
        ObservedDeployment("orders", "dp-gone", "STOPPED", "/c/gone", retired_at=retired, checkpoint_present=False),
    )
    retain = plan(Observed((), ds), RetentionPolicy(retired_retention_s=7 * 86400), NOW)
    assert retain.checkpoints == []
    expired = plan(Observed((), ds), RetentionPolicy(retired_retention_s=86400), NOW)
    assert [(a.target, a.location) for a in expired.checkpoints] == [("dp-old", "/c/old")]
    delete = plan(Observed((), ds), RetentionPolicy(on_cancellation=OnCancellation.DELETE), NOW)
    assert [a.target for a in delete.checkpoints] == ["dp-old"] and "delete-on-cancellation" in delete.actions[0].reason


def test_job_scope_and_per_job_policies() -> None:
    a, b = [snap(age_h=h) for h in (2, 1)], [snap(job="billing", age_h=h) for h in (2, 1)]
    keep1 = RetentionPolicy(savepoint=KindPolicy(keep_last=1))
    scoped = plan(Observed(tuple(a + b), jobs=frozenset({"billing"})), keep1, NOW)
    assert deleted_ids(scoped) == {b[0].id}
    per_job = plan(Observed(tuple(a + b)), RetentionPolicy(), NOW, job_policies={"orders": keep1})
    assert deleted_ids(per_job) == {a[0].id}


def test_plan_prints_as_json_and_rows_with_reasons() -> None:
    ms = (snap(age_h=2, files=(1,)), snap(age_h=1))
    p = plan(Observed(ms, blobs=(blob(1),)), RetentionPolicy(savepoint=KindPolicy(keep_last=1)), NOW)
    data = json.loads(json.dumps(p.to_dict()))
    assert data["summary"] == {"snapshots": 1, "blobs": 1, "checkpoints": 0, "repacks": 0, "bytes": PACK_SIZE}
    assert [a["action"] for a in data["actions"]] == ["delete-snapshot", "delete-blobs"]
    assert all(row[3] for row in p.rows())


def test_parse_policy_from_a_jobs_file_table() -> None:
    policy = parse_policy(
        {
            "checkpoint": {"keep_last": 3, "max_age": "2d"},
            "savepoint": {"keep_last": 10},
            "failed_grace": "12h",
            "blob_grace": 60,
            "on_cancellation": "delete",
            "max_unused": "25%",
        }
    )
    assert policy.max_unused == 0.25 and parse_policy({"max_unused": 0.1}).max_unused == 0.1
    assert policy.checkpoint == KindPolicy(3, 2 * 86400.0) and policy.savepoint == KindPolicy(10, None)
    assert policy.failed_grace_s == 12 * HOUR and policy.blob_grace_s == 60.0
    assert policy.on_cancellation is OnCancellation.DELETE


def test_retention_durations_take_the_one_grammar_words_and_hours_too() -> None:
    """Issue 43: `max_age = "2 days"` was refused; every retention duration reads core/durations.py's grammar."""
    policy = parse_policy(
        {
            "checkpoint": {"max_age": "2 days", "period": "30 minutes"},
            "savepoint": {"max_age": "1 week"},
            "failed_grace": "12 hours",
            "abandoned_after": "6 H",
            "retired_retention": " 7 days ",
            "blob_grace": "90 min",
        }
    )
    assert policy.checkpoint == KindPolicy(3, 2 * 24 * HOUR, 0.5 * HOUR) and policy.savepoint.max_age_s == 7 * 24 * HOUR
    assert (policy.failed_grace_s, policy.abandoned_after_s) == (12 * HOUR, 6 * HOUR)
    assert (policy.retired_retention_s, policy.blob_grace_s) == (7 * 24 * HOUR, 1.5 * HOUR)
    assert parse_policy({"blob_grace": "60"}).blob_grace_s == 60.0  # a plain number is seconds, as before


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"checkpoint": {"keep_last": 0}}, "retention.checkpoint.keep_last must be a whole number >= 1"),
        ({"checkpoint": {"keep": 3}}, "retention.checkpoint has unknown key(s) keep"),
        (
            {"savepoint": {"max_age": "2 fortnights"}},
            "retention.savepoint.max_age = '2 fortnights' has an unknown unit",
        ),
        (
            {"savepoint": {"max_age": "1 day 2 hours"}},
            "retention.savepoint.max_age = '1 day 2 hours' is not a duration",
        ),
        ({"checkpoint": {"period": "0h"}}, "retention.checkpoint.period = '0h' must be longer than 0"),
        ({"savepoints": {}}, "retention has unknown key(s) savepoints"),
        ({"on_cancellation": "drop"}, "retention.on_cancellation must be 'retain' or 'delete'"),
        ({"blob_grace": -1}, "retention.blob_grace = -1 must not be negative"),
        ({"failed_grace": "-2d"}, "retention.failed_grace = '-2d' must not be negative"),
        ({"checkpoint": 3}, "retention.checkpoint must be a table"),
        ({"max_unused": "half"}, "retention.max_unused must be a fraction such as 0.25 or '25%'"),
        ({"max_unused": 1.5}, "retention.max_unused must be between 0 and 1"),
    ],
)
def test_parse_policy_errors_name_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_policy(raw)
    assert message in str(info.value)


# ---------------------------------------------------------------- safety, property-based


@st.composite
def histories(draw: st.DrawFn) -> tuple[Observed, RetentionPolicy]:
    specs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["orders", "billing"]),
                st.sampled_from(list(Kind)),
                st.sampled_from(list(SnapshotStatus)),
                st.floats(0.01, 400.0),
                st.booleans(),
                st.frozensets(st.integers(0, 12), max_size=4),
            ),
            max_size=14,
        )
    )
    manifests = tuple(
        snap(job, kind, status, age, pinned=pinned, files=tuple(sorted(files)))
        for job, kind, status, age, pinned, files in specs
    )
    deployments = tuple(
        ObservedDeployment(
            "orders",
            f"dp-{i}",
            draw(st.sampled_from([s.value for s in State])),
            f"/c/{i}",
            restored_from=draw(st.sampled_from([m.id for m in manifests])) if manifests else None,
            retired_at=(NOW - timedelta(days=draw(st.integers(0, 10)))).isoformat(),
        )
        for i in range(draw(st.integers(0, 3)))
    )
    objects = {blob(n, draw(st.floats(0.0, 5.0))).key: blob(n, draw(st.floats(0.0, 5.0))) for n in range(14)}
    markers = [  # packs a repack emptied, some long gone (ids 4 and 5 hold no content)
        ObjectInfo(retired_key(pack(i)), 0, (NOW - timedelta(hours=draw(st.floats(0.0, 5.0)))).timestamp())
        for i in sorted(draw(st.frozensets(st.integers(0, 5), max_size=3)))
    ]
    limits = st.builds(KindPolicy, st.none() | st.integers(1, 4), st.none() | st.floats(0.0, 200 * HOUR))
    policy = RetentionPolicy(
        checkpoint=draw(limits),
        savepoint=draw(limits),
        failed_grace_s=draw(st.floats(0.0, 48 * HOUR)),
        blob_grace_s=draw(st.floats(0.0, 4 * HOUR)),
        on_cancellation=draw(st.sampled_from(list(OnCancellation))),
        max_unused=draw(st.floats(0.0, 1.0)),
    )
    return Observed(manifests, deployments, (*objects.values(), *markers)), policy


@settings(max_examples=200, deadline=None)
@given(histories())
def test_the_plan_never_deletes_what_must_stay(history: tuple[Observed, RetentionPolicy]) -> None:
    observed, policy = history
    p = plan(observed, policy, NOW)
    deleted = deleted_ids(p)
    remaining = [m for m in observed.snapshots if m.id not in deleted]
    for job in ("orders", "billing"):
        for kind in Kind:
            completed = [
                m for m in observed.snapshots if (m.job, m.kind, m.status) == (job, kind, SnapshotStatus.COMPLETED)
            ]
            if completed:
                assert max(completed, key=lambda m: m.id[3:]).id not in deleted
    assert not any(m.pinned for m in observed.snapshots if m.id in deleted)
    assert all(a.version == f"v-{a.target}" for a in p.snapshots)  # deleted only as the plan saw it
    running_sources = {d.restored_from for d in observed.deployments if State(d.state).live}
    assert not running_sources & deleted
    referenced = {key for m in remaining for key in m.objects}
    deleted_objects = set(p.blob_keys)
    assert not referenced & deleted_objects
    listed = {o.key: o for o in observed.blobs}
    for key in deleted_objects:
        if key.endswith(".retired"):  # a marker goes with its pack, or after it
            pack_key_ = key.removesuffix(".retired") + ".pack"
            assert pack_key_ in deleted_objects or pack_key_ not in listed
        else:  # the grace period runs from the repack's marker when there is one
            clock = listed.get(retired_key(key), listed[key]) if key.endswith(".pack") else listed[key]
            assert clock.mtime < NOW.timestamp() - policy.blob_grace_s
    for action in p.repacks:  # the most any one remaining snapshot uses of it leaves more than max_unused unused
        live = max((m.objects.get(action.target, 0) for m in remaining), default=0)
        assert live and 1 - live / listed[action.target].size > policy.max_unused
    if any(
        m.status is SnapshotStatus.IN_PROGRESS and (NOW - _created(m)).total_seconds() < 6 * HOUR for m in remaining
    ):
        assert p.blob_keys == [] and p.repacks == []
    assert all(a.reason for a in p.actions)
    live = {d.id for d in observed.deployments if State(d.state).live or d.state == "LOST"}
    assert not live & {a.target for a in p.checkpoints}


def _created(m: SnapshotEntry) -> datetime:
    return datetime.fromisoformat(m.created_at.replace("Z", "+00:00"))


# ---------------------------------------------------------------- execution on real stores


def _snapshots(store: SnapshotStore, ckpt: Path, job: str, count: int, first_batch: int, **kw: Any) -> list[Manifest]:
    made = []
    for i in range(count):
        add_batch(ckpt, first_batch + i, partitions=kw.pop("partitions", 2))
        made.append(create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job=job, **kw), concurrency=4))
    return made


def _all_completed_verify(store: SnapshotStore) -> int:
    completed = [m for m in store.list() if m.status is SnapshotStatus.COMPLETED]
    for m in completed:
        report = verify_snapshot(store, m.job, m.id)
        assert report.ok, (m.id, report.problems)
    return len(completed)


def test_prune_on_a_local_store_leaves_every_remaining_snapshot_verifiable(tmp_path: Path) -> None:
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    orders = write_checkpoint(tmp_path / "orders", batches=2)
    billing = write_checkpoint(tmp_path / "billing", batches=2)
    _snapshots(store, orders, "orders", 4, 2)
    _snapshots(store, orders, "orders", 3, 6, kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC)
    pinned = _snapshots(store, billing, "billing", 1, 2, pinned=True)[0]
    _snapshots(store, billing, "billing", 2, 3)
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=1), checkpoint=KindPolicy(keep_last=1), blob_grace_s=0)

    decided, result = prune(store, policy)
    assert result is not None and result.snapshots == len(decided.snapshots) == 3 + 2 + 1
    assert {m.id for m in store.list("billing")} >= {pinned.id}
    assert _all_completed_verify(store) == 4
    assert stored_objects(store) == referenced_objects(store)  # everything unreferenced is gone
    again, _ = prune(store, policy, dry_run=True)
    assert again.actions == []


def test_dry_run_and_a_bad_policy_delete_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store_dir = tmp_path / "store"
    store = SnapshotStore(LocalStorage(store_dir))
    _snapshots(store, write_checkpoint(tmp_path / "c", batches=1), "orders", 3, 1)
    before = tree(store_dir)
    code = main(["prune", "--store", str(store_dir), "--savepoint-keep-last", "1", "--dry-run", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["dry_run"] and data["plan"]["summary"]["snapshots"] == 2 and data["result"] is None
    assert tree(store_dir) == before
    code = main(["prune", "--store", str(store_dir), "--savepoint-max-age", "3 fortnights"])
    error = capsys.readouterr().err
    assert code == 2 and "retention flags.savepoint.max_age = '3 fortnights' has an unknown unit" in error
    assert '"2 days"' in error  # the accepted forms are listed
    assert tree(store_dir) == before


def test_prune_cli_table_and_policy_from_the_jobs_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store_dir = tmp_path / "store"
    store = SnapshotStore(LocalStorage(store_dir))
    made = _snapshots(store, write_checkpoint(tmp_path / "c", batches=1), "orders", 3, 1)
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        f'[defaults]\nstore = "{store_dir}"\ncheckpoint_root = "{tmp_path}/ck"\n'
        '[jobs.orders]\nversions.v1 = { application = "job.py" }\nretention.savepoint = { keep_last = 2 }\n'
    )
    code = main(["prune", "orders", "--jobs", str(jobs), "--savepoint-max-age", "2 days", "--dry-run"])
    out = capsys.readouterr().out  # the flags take the one grammar too: none is 2 days old
    assert code == 0 and made[0].id in out and "beyond the newest 2 savepoints" in out and "max age" not in out
    code = main(["prune", "orders", "--jobs", str(jobs)])
    out = capsys.readouterr().out
    assert code == 0 and made[0].id in out and "beyond the newest 2 savepoints" in out
    assert [m.id for m in store.list("orders")] == [m.id for m in made[1:]]
    jobs.write_text(jobs.read_text().replace("keep_last = 2", "keep_last = -1"))
    code = main(["prune", "--jobs", str(jobs)])
    assert code == 2 and "[jobs.orders] retention.savepoint.keep_last" in capsys.readouterr().err
    assert len(store.list("orders")) == 2


def test_retired_checkpoint_location_is_deleted_on_cancellation(tmp_path: Path) -> None:
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    live_dir, old_dir = write_checkpoint(tmp_path / "live", 2), write_checkpoint(tmp_path / "old", 2)
    records = Deployments(store.storage)
    records.put(Deployment("dp-old", "orders", "v1", str(old_dir), retired_at=NOW.isoformat()))
    records.write_status("orders", "dp-old", Heartbeat(State.STOPPED, time.time()))
    _running(store, "dp-live", live_dir)
    decided, _ = prune(store, RetentionPolicy(on_cancellation=OnCancellation.DELETE))
    assert [a.target for a in decided.checkpoints] == ["dp-old"]
    assert tree(old_dir) == {} and tree(live_dir) != {}
    again, _ = prune(store, RetentionPolicy(on_cancellation=OnCancellation.DELETE), dry_run=True)
    assert again.actions == []


# ---------------------------------------------------------------- retained checkpoints


def _running(store: SnapshotStore, deployment: str, ckpt: Path) -> None:
    records = Deployments(store.storage)
    records.put(Deployment(deployment, "orders", "v1", str(ckpt)))
    records.write_status("orders", deployment, Heartbeat(State.RUNNING, time.time() + 3600))


def test_checkpoint_snapshots_running_deployments_once_per_batch(tmp_path: Path) -> None:
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=3)
    _running(store, "dp-1", ckpt)
    Deployments(store.storage).put(Deployment("dp-0", "orders", "v1", str(tmp_path / "gone"), retired_at="x"))
    orders = JobContext(JobSpec.undeclared("orders"), store)
    first = retain_checkpoints(orders)
    assert [(o.deployment, o.batch_id, o.skipped) for o in first] == [("dp-1", 2, None)]
    manifest = store.get("orders", first[0].snapshot or "")
    assert (manifest.kind, manifest.trigger, manifest.deployment) == (Kind.CHECKPOINT, Trigger.PERIODIC, "dp-1")
    second = retain_checkpoints(orders)
    assert second[0].skipped and "already in snapshot" in second[0].skipped and len(store.list("orders")) == 1
    add_batch(ckpt, 3)
    third = retain_checkpoints(orders)
    assert third[0].batch_id == 3 and len(store.list("orders")) == 2


def test_checkpoint_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    store_dir = tmp_path / "store"
    _running(SnapshotStore(LocalStorage(store_dir)), "dp-1", write_checkpoint(tmp_path / "ckpt", batches=2))
    args = ["retain", "orders", "--store", str(store_dir)]
    assert main([*args, "--jobs", str(tmp_path / "none.toml")]) == 3  # an explicit missing jobs file
    assert "jobs file" in capsys.readouterr().err
    monkeypatch.delenv("SAVEPOINTS_JOBS", raising=False)  # the test session's Airflow set-up names one
    monkeypatch.chdir(tmp_path)  # no ./jobs.toml here: the store alone is enough
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["deployment"] == "dp-1" and rows[0]["batch_id"] == 1 and rows[0]["skipped"] is None


# ---------------------------------------------------------------- races and crashes


class GatedStorage(LocalStorage):
    """A checkpoint whose state files cannot be read until the gate opens: holds a create in flight."""

    def __init__(self, root: Path, entered: threading.Event, gate: threading.Event) -> None:
        super().__init__(root)
        self.entered, self.gate = entered, gate

    def read(self, key: str) -> bytes:
        if key.endswith(".delta"):
            self.entered.set()
            assert self.gate.wait(30)
        return super().read(key)


def test_prune_racing_a_create_does_not_break_it(tmp_path: Path) -> None:
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2)
    old = _snapshots(store, ckpt, "orders", 2, 2)  # the older one's blobs are reused by the new create
    add_batch(ckpt, 4)
    entered, gate = threading.Event(), threading.Event()
    made: list[Manifest] = []
    source: Storage = GatedStorage(ckpt, entered, gate)
    creator = threading.Thread(
        target=lambda: made.append(create_snapshot(store, source, SnapshotRequest(job="orders"), concurrency=2))
    )
    creator.start()
    assert entered.wait(30)
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=1), blob_grace_s=0, max_unused=0.0)
    before = stored_objects(store)
    decided, result = prune(store, policy)
    gate.set()
    creator.join(30)
    assert result is not None and old[0].id in {a.target for a in decided.snapshots}
    assert result.blobs == result.repacked == 0 and "in flight" in " ".join(decided.notes)
    assert before <= stored_objects(store)  # nothing deleted, nothing retired
    assert made and made[0].status is SnapshotStatus.COMPLETED
    assert verify_snapshot(store, "orders", made[0].id).ok
    _, after = prune(store, policy)  # nothing in flight now: the old snapshot's pack is repacked...
    assert after is not None and after.repacked > 0
    _, last = prune(store, policy)  # ... and goes in the next run; every snapshot stays whole
    assert last is not None and last.blobs > 0
    assert _all_completed_verify(store) >= 1 and made[0].id in {m.id for m in store.list()}
    assert stored_objects(store) == referenced_objects(store)


def test_execute_rechecks_in_flight_before_deleting_blobs(tmp_path: Path) -> None:
    """The plan was made with nothing in flight; a create starting before the blobs go stops them."""
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2)
    _snapshots(store, ckpt, "orders", 2, 2)
    orphan = "blobs/ff/" + "f" * 64  # left by a crashed create
    store.storage.write(orphan, b"x")
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=1), blob_grace_s=0, max_unused=0.0)
    decided = plan(observe(store), policy, datetime.now(UTC))
    assert decided.blob_keys == [orphan] and decided.repacks
    before = stored_objects(store)
    store.add(_in_progress())
    result = execute(store, decided, policy)
    assert result.blobs == result.repacked == 0 and result.deferred_blobs == 1
    assert stored_objects(store) == before  # no object deleted, no pack retired
    assert "repack stopped" in " ".join(result.notes)


def _in_progress() -> Manifest:
    now = datetime.now(UTC)
    return Manifest(new_snapshot_id(Kind.SAVEPOINT, now), "orders", Kind.SAVEPOINT, Trigger.MANUAL,
                    SnapshotStatus.IN_PROGRESS, "/x", now.isoformat())  # fmt: skip


def _prune_process(store: str, cwd: Path, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "airflow_plugin", "prune", "--store", store, "--json", *extra]
    command += ["--savepoint-keep-last", "1", "--blob-grace", "0", "--max-unused", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.mark.slow
def test_prune_killed_with_sigkill_leaves_completed_snapshots_and_the_next_run_finishes(
    tmp_path: Path, s3_store: str
) -> None:
    store = SnapshotStore(open_storage(s3_store))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=1, partitions=8)
    rng = random.Random(4)
    kills = 0
    for round_no in range(5):
        for i in range(3):  # three new savepoints with new state files each round
            add_batch(ckpt, 1 + round_no * 3 + i, partitions=8)
            create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job="orders"), concurrency=8)
        orphans = [f"blobs/ff/{'f' * 60}{round_no:02d}{n:02d}" for n in range(1500)]
        list(run_parallel(lambda key: store.storage.write(key, b"x"), orphans, concurrency=32))
        started = time.monotonic()
        _prune_process(s3_store, tmp_path, "--dry-run").communicate(timeout=120)
        duration = time.monotonic() - started  # start-up and observing: most of a prune's life
        process = _prune_process(s3_store, tmp_path)
        time.sleep(rng.uniform(0.5, 1.3) * duration)
        process.send_signal(signal.SIGKILL)
        kills += process.wait() == -signal.SIGKILL
        assert _all_completed_verify(store) >= 1
    assert kills >= 2, "the kills should have hit running prunes"
    for _ in range(2):  # the first finishes deletions and repacks; the second collects the emptied packs
        process = _prune_process(s3_store, tmp_path)
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err.decode()
    assert _all_completed_verify(store) == 1
    assert stored_objects(store) == referenced_objects(store)
