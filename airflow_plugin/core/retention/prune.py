"""Retention, the acting half: observe the store into plain data, execute a plan from retention.py, record
what the store holds afterwards (usage.py), and take retained checkpoints of running deployments.

Observing reads no manifest: each job's snapshot catalog, checked against a listing of its manifests
(ids and versions; a difference is settled from the manifests), its deployment index and the heartbeats of
deployments not retired, and the listing of stored objects.

Crash safety of `execute`: manifests go first (a snapshot disappears as a whole the moment its manifest
does; only the version the plan saw: one pinned since stays), then retired checkpoint locations, then
repacks (repack.py: they only add and re-point), then stored objects. An object is deleted only after every
manifest that referenced it is gone, so a prune killed at any point leaves every COMPLETED snapshot whole;
what it did not finish is unreferenced and old, so the next run's plan contains it again. Every delete is
idempotent.

Racing a create: right before the repacks and before each batch of object deletions the catalogs are read and
checked again; a snapshot in flight (or a new reference) that appeared since the plan was made stops them,
and they are left for the next run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..catalog.snapshots import SnapshotEntry
from ..errors import CheckpointError
from ..guards import source as source_guard
from ..jobs.context import JobContext
from ..jobs.deployments import Deployments, observed_state
from ..jobs.observe import state_of
from ..jobs.snapshot import snapshot_deployment
from ..layout import BLOBS, PACKS, check_name
from ..parallel import chunked, run_parallel
from ..records.deployment import DEFAULT_HEARTBEAT_TIMEOUT, State
from ..records.manifest import Kind, SnapshotStatus, Trigger, in_flight
from ..snapshots.checkpoint import read_restart_point
from ..snapshots.store import SnapshotStore
from ..sources.kafka import KafkaSettings
from ..storage import Storage, open_storage
from .plan import Observed, ObservedDeployment, Plan
from .plan import plan as make_plan
from .policy import RetentionPolicy
from .repack import repack
from .usage import record_usage

log = logging.getLogger(__name__)

BLOB_CHUNK = 8000  # blobs deleted between two in-flight checks: 8 parallel DeleteObjects requests of 1000


# ---------------------------------------------------------------- observe


def _deployments(
    store: SnapshotStore, job: str, timeout: float, open_location: Callable[[str], Storage]
) -> list[ObservedDeployment]:
    records = Deployments(store.storage)
    observed = []
    for d in records.list(job):
        state = observed_state(d, records.status(job, d.id), timeout)
        present = bool(d.retired_at) and state.value in ("STOPPED", "FAILED") and open_location(d.checkpoint).exists()
        source = d.restored_from or d.prerestored_from  # a standby's pre-restore is needed to activate it
        observed.append(ObservedDeployment(job, d.id, str(state), d.checkpoint, source, d.retired_at, present))
    return observed


def observe(
    store: SnapshotStore,
    job: str | None = None,
    *,
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
    open_location: Callable[[str], Storage] = open_storage,
    kafka: Callable[[str], KafkaSettings | None] = lambda job: None,
) -> Observed:
    """Read the store: the snapshots of ALL jobs (blob references are store-wide) from their catalogs,
    checked against their manifests, deployments with their observed state, and the blob listing; and, per
    job in scope, its snapshots' Kafka positions against its broker (`kafka(job)`). `job` limits what the
    plan may touch, not what is read. Deployments are read for every job because a deployment may be
    restored from another job's snapshot."""
    if job is not None:
        check_name(job, "job name")
    listing = store.validated()
    snapshots = tuple(listing.entries)
    names = store.jobs()
    found = run_parallel(lambda name: _deployments(store, name, heartbeat_timeout, open_location), names)
    deployments = tuple(sorted((d for ds in found for d in ds), key=lambda d: (d.job, d.id)))
    blobs = (*store.storage.list(BLOBS), *store.storage.list(PACKS))
    checks = {}
    for name in sorted({m.job for m in snapshots} if job is None else {job}):
        checks |= source_guard.assess([m for m in snapshots if m.job == name], kafka(name))
    notes = tuple(
        f"the catalog of job {name} differed from its manifests in {len(ids)} snapshots (written by hand, or "
        f"restored from a backup?): settled from the manifests"
        for name, ids in sorted(listing.repaired.items())
    )
    return Observed(snapshots, deployments, blobs, frozenset({job}) if job else None, checks, notes)


# ---------------------------------------------------------------- act


@dataclass
class PruneResult:
    snapshots: int = 0
    checkpoints: int = 0
    checkpoint_objects: int = 0
    blobs: int = 0
    deferred_blobs: int = 0
    repacked: int = 0
    notes: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)  # snapshots of the plan that changed since: not deleted

    def to_dict(self) -> dict[str, Any]:
        return {
            "deleted_snapshots": self.snapshots,
            "left_alone": self.left_alone,
            "deleted_checkpoints": self.checkpoints,
            "deleted_checkpoint_objects": self.checkpoint_objects,
            "deleted_blobs": self.blobs,
            "deferred_blobs": self.deferred_blobs,
            "repacked_packs": self.repacked,
            "notes": self.notes,
        }


def _blocked(
    store: SnapshotStore, keys: list[str], policy: RetentionPolicy
) -> tuple[str | None, set[str], list[SnapshotEntry]]:
    """Look again right before deleting or repacking: a snapshot in flight stops everything; an object
    referenced by a snapshot that appeared (or was re-pointed) since the plan was made is spared."""
    snapshots = store.validated().entries
    now = datetime.now(UTC)
    flying = [m.id for m in snapshots if in_flight(m, now, policy.abandoned_after_s)]
    if flying:
        return f"snapshots in flight: {', '.join(flying)}", set(), snapshots
    wanted = set(keys)
    return None, {key for m in snapshots for key in m.objects if key in wanted}, snapshots


def _repack(store: SnapshotStore, packs: list[str], policy: RetentionPolicy, result: PruneResult) -> None:
    if not packs:
        return
    reason, _, snapshots = _blocked(store, [], policy)
    if reason:
        result.notes.append(f"repack stopped, left for the next run: {reason}")
        return
    repacked = repack(store, packs, snapshots, policy.max_unused)
    result.notes += repacked.notes
    result.repacked += repacked.packs


def _delete_blobs(store: SnapshotStore, keys: list[str], policy: RetentionPolicy, result: PruneResult) -> None:
    for number, chunk in enumerate(chunked(keys, BLOB_CHUNK)):
        reason, referenced, _ = _blocked(store, chunk, policy)
        if reason:
            result.deferred_blobs += len(keys) - number * BLOB_CHUNK
            result.notes.append(f"blob deletion stopped, left for the next run: {reason}")
            return
        todo = [k for k in chunk if k not in referenced]
        result.deferred_blobs += len(chunk) - len(todo)
        result.blobs += store.storage.delete(todo)


def execute(
    store: SnapshotStore,
    plan: Plan,
    policy: RetentionPolicy | None = None,
    *,
    open_location: Callable[[str], Storage] = open_storage,
) -> PruneResult:
    """Carry out `plan`: manifests, retired checkpoint locations, repacks, objects (see the module doc).
    Idempotent: objects already gone are fine, so a rerun of the same plan, or the next plan, finishes."""
    policy = policy or RetentionPolicy()
    result = PruneResult(notes=list(plan.notes))
    left = store.remove([(a.job or "", a.target, a.version) for a in plan.snapshots])
    result.snapshots = len(plan.snapshots) - len(left)
    result.left_alone = [snapshot_id for _, snapshot_id, _ in left]
    if left:
        result.notes.append(f"left alone, changed since the plan (pinned?): {', '.join(result.left_alone)}")
    for action in plan.checkpoints:
        location = open_location(action.location or "")
        result.checkpoint_objects += location.delete([info.key for info in location.list()])
        result.checkpoints += 1
    _repack(store, [a.target for a in plan.repacks], policy, result)
    _delete_blobs(store, plan.blob_keys, policy, result)
    log.info("prune: %s", result.to_dict())
    return result


def prune(
    store: SnapshotStore,
    policy: RetentionPolicy | None = None,
    *,
    job: str | None = None,
    job_policies: Mapping[str, RetentionPolicy] | None = None,
    dry_run: bool = False,
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
    open_location: Callable[[str], Storage] = open_storage,
    kafka: Callable[[str], KafkaSettings | None] = lambda job: None,
) -> tuple[Plan, PruneResult | None]:
    """Observe, plan, and (unless `dry_run`) execute. The one call for DAGs and the CLI."""
    policy = policy or RetentionPolicy()
    observed = observe(store, job, heartbeat_timeout=heartbeat_timeout, open_location=open_location, kafka=kafka)
    decided = make_plan(observed, policy, datetime.now(UTC), job_policies=job_policies)
    if dry_run:
        return decided, None
    result = execute(store, decided, policy, open_location=open_location)
    record_usage(store)  # what the store holds now, for `savepoints metrics` (one object to read per scrape)
    return decided, result


# ---------------------------------------------------------------- retained checkpoints


@dataclass
class CheckpointOutcome:
    deployment: str
    snapshot: str | None = None
    batch_id: int | None = None
    skipped: str | None = None  # why nothing was taken

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _already_taken(manifests: list[SnapshotEntry], deployment: str, batch_id: int) -> str | None:
    for m in manifests:
        if m.deployment == deployment and m.status is SnapshotStatus.COMPLETED and m.batch_id == batch_id:
            return m.id
    return None


def retain_checkpoints(ctx: JobContext) -> list[CheckpointOutcome]:
    """Snapshot every RUNNING deployment of the job as kind checkpoint, trigger PERIODIC (Flink's retained,
    externalized checkpoints), skipping one whose last committed batch is already snapshotted. Any kind of
    existing snapshot of that deployment at that batch counts: a savepoint holds the same state."""
    manifests = ctx.store.list(ctx.name)
    outcomes = []
    for d in ctx.deployments.list(ctx.name):
        if state_of(ctx, d) is not State.RUNNING:
            continue
        try:
            batch_id = read_restart_point(ctx.open(d.checkpoint)).batch_id
        except CheckpointError as exc:
            outcomes.append(CheckpointOutcome(d.id, skipped=f"no usable checkpoint yet: {exc}"))
            continue
        taken = _already_taken(manifests, d.id, batch_id)
        if taken:
            outcomes.append(
                CheckpointOutcome(d.id, taken, batch_id, f"batch {batch_id} is already in snapshot {taken}")
            )
            continue
        manifest = snapshot_deployment(ctx, d, kind=Kind.CHECKPOINT, trigger=Trigger.PERIODIC)
        outcomes.append(CheckpointOutcome(d.id, manifest.id, manifest.batch_id))
    return outcomes
