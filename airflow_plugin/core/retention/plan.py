"""Retention, deciding: the PURE planner that turns what the store holds into a plan of deletions, each
with its reason. No I/O here: `prune.py` observes the store into `Observed` (the snapshots as their
catalogs list them, checked against the manifests) and executes the `Plan`; a dry run prints the plan and
stops (observe, decide, act).

Safety rules the planner never breaks, whatever the policy says:
- the newest COMPLETED snapshot of a job and kind is kept;
- a pinned snapshot is kept;
- a snapshot that a live (or LOST: it may still run) deployment was restored from is kept;
- a stored object (a blob or a pack) is deleted only when no REMAINING manifest of any job (any status)
  references any content in it, it is older than the GC grace period (a pack a repack emptied: since
  its `.retired` marker), and no snapshot is in flight (a create writes its IN_PROGRESS manifest before
  it looks at what the store holds, so while one runs it may be about to reuse any content);
- a pack is repacked (its referenced contents copied into a new pack, the manifests pointed there) only
  when more than `max_unused` of it may be unreferenced, and never while a snapshot is in flight. The
  catalogs say which bytes of a pack each snapshot references, not which contents two snapshots share, so
  the referenced share is at least the largest of any one snapshot: the plan names the packs that may be
  worth it, the repack reads the manifests and moves only a pack that is (repack.py). The repack deletes
  nothing: the emptied pack goes by the rule above, in a later run.

The plan also marks the snapshots that can no longer be restored without losing records because Kafka no
longer holds what they would read next (`Observed.source_checks`, from the broker: guards/source.py).

Over 300 lines: every deletion rule lives in this one pure module, where the property tests see them all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from ..catalog.snapshots import SnapshotEntry
from ..durations import format_duration
from ..errors import InvalidInput
from ..layout import is_stored_content, manifest_key, pack_of_retired, retired_key
from ..records.deployment import State
from ..records.manifest import Kind, SnapshotStatus, in_flight
from ..sources.kafka import SourceCheck
from ..storage import ObjectInfo
from ..timestamps import epoch_of
from .policy import KindPolicy, OnCancellation, RetentionPolicy

# A deployment whose state is one of these may still be running: what it was restored from is kept.
_MAYBE_RUNNING = tuple(str(s) for s in State if s.live or s is State.LOST)
_FINISHED = tuple(str(s) for s in State if not s.live and s is not State.LOST)


class ActionKind(StrEnum):
    DELETE_SNAPSHOT = "delete-snapshot"
    DELETE_BLOBS = "delete-blobs"
    DELETE_CHECKPOINT = "delete-checkpoint"
    REPACK = "repack"


# ---------------------------------------------------------------- what the planner sees


@dataclass(frozen=True)
class ObservedDeployment:
    """A deployment as plain data: its observed state (deployments.State value) and whether its live
    checkpoint location still holds anything."""

    job: str
    id: str
    state: str
    checkpoint: str
    restored_from: str | None = None
    retired_at: str | None = None
    checkpoint_present: bool = True


@dataclass(frozen=True)
class Observed:
    """What the store holds. `snapshots` are ALL jobs' (blob references are store-wide); `jobs` limits
    which jobs' snapshots and deployments the plan may touch (None: every job); `notes` go into the plan."""

    snapshots: tuple[SnapshotEntry, ...]
    deployments: tuple[ObservedDeployment, ...] = ()
    blobs: tuple[ObjectInfo, ...] = ()
    jobs: frozenset[str] | None = None
    source_checks: Mapping[str, SourceCheck] = field(default_factory=dict)  # snapshot id -> its Kafka positions
    notes: tuple[str, ...] = ()


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Action:
    """One deletion. `keys` are store keys (a manifest, blobs); a checkpoint action names its location; a
    snapshot's names the manifest version it was planned from (changed since: left alone)."""

    kind: ActionKind
    target: str
    reason: str
    job: str | None = None
    keys: tuple[str, ...] = ()
    bytes: int = 0
    location: str | None = None
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"action": str(self.kind), "target": self.target, "job": self.job}
        data |= {"reason": self.reason, "bytes": self.bytes}
        if self.kind is ActionKind.DELETE_BLOBS:
            data["count"] = len(self.keys)
        if self.location:
            data["location"] = self.location
        return data


@dataclass(frozen=True)
class Kept:
    """A snapshot the policy alone would have deleted, and the safety rule that keeps it."""

    job: str
    snapshot: str
    reason: str


@dataclass(frozen=True)
class Unrestorable:
    """A snapshot whose Kafka records are gone: restoring it would lose them (or needs the gap accepted)."""

    job: str
    snapshot: str
    records_lost: int
    reason: str


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unrestorable: list[Unrestorable] = field(default_factory=list)

    @property
    def snapshots(self) -> list[Action]:
        return [a for a in self.actions if a.kind is ActionKind.DELETE_SNAPSHOT]

    @property
    def blob_keys(self) -> list[str]:
        return [k for a in self.actions if a.kind is ActionKind.DELETE_BLOBS for k in a.keys]

    @property
    def checkpoints(self) -> list[Action]:
        return [a for a in self.actions if a.kind is ActionKind.DELETE_CHECKPOINT]

    @property
    def repacks(self) -> list[Action]:
        return [a for a in self.actions if a.kind is ActionKind.REPACK]

    def to_dict(self) -> dict[str, Any]:
        return {
            "actions": [a.to_dict() for a in self.actions],
            "kept": [{"job": k.job, "snapshot": k.snapshot, "reason": k.reason} for k in self.kept],
            "notes": list(self.notes),
            "unrestorable": [
                {"job": u.job, "snapshot": u.snapshot, "records_lost": u.records_lost, "reason": u.reason}
                for u in self.unrestorable
            ],
            "summary": {
                "snapshots": len(self.snapshots),
                "blobs": len(self.blob_keys),
                "checkpoints": len(self.checkpoints),
                "repacks": len(self.repacks),
                "bytes": sum(
                    a.bytes for a in self.actions if a.kind not in (ActionKind.DELETE_SNAPSHOT, ActionKind.REPACK)
                ),
            },
        }

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(action, job, target, reason) for a table: deletions first, then what safety rules kept."""
        rows = [(str(a.kind), a.job or "*", a.target, a.reason) for a in self.actions]
        rows += [("keep", k.job, k.snapshot, k.reason) for k in self.kept]
        rows += [("unrestorable", u.job, u.snapshot, u.reason) for u in self.unrestorable]
        return rows


# ---------------------------------------------------------------- the planner


def age_seconds(snapshot: SnapshotEntry, now: datetime) -> float:
    return now.timestamp() - epoch_of(snapshot.created_at)


def _protected(observed: Observed) -> dict[str, str]:
    """Snapshot id -> why a deployment needs it: restored from by one that is, or may be, running."""
    return {
        d.restored_from: f"deployment {d.id} ({d.state}) was restored from it"
        for d in observed.deployments
        if d.restored_from and d.state in _MAYBE_RUNNING
    }


def _leftover_reason(m: SnapshotEntry, policy: RetentionPolicy, now: datetime) -> str | None:
    age = age_seconds(m, now)
    if m.status is SnapshotStatus.FAILED and age > policy.failed_grace_s:
        return f"FAILED, older than the grace period ({format_duration(policy.failed_grace_s)})"
    if m.status is SnapshotStatus.IN_PROGRESS and age > policy.abandoned_after_s:
        return f"IN_PROGRESS for longer than {format_duration(policy.abandoned_after_s)}: abandoned by a crash"
    return None


def _history_reasons(completed: list[SnapshotEntry], limits: KindPolicy, now: datetime) -> dict[str, str]:
    """Policy verdicts for the COMPLETED snapshots of one job and kind, newest first, before safety rules.
    Pinned ones do not count towards keep_last: keep_last N keeps N rotating snapshots besides them."""
    reasons: dict[str, str] = {}
    rank = 0
    for m in completed:
        if m.pinned:
            continue
        rank += 1
        if limits.keep_last is not None and rank > limits.keep_last:
            reasons[m.id] = f"beyond the newest {limits.keep_last} {m.kind}s"
        elif limits.max_age_s is not None and age_seconds(m, now) > limits.max_age_s:
            reasons[m.id] = f"older than max age {format_duration(limits.max_age_s)}"
    return reasons


def _snapshot_decisions(
    observed: Observed, policy: RetentionPolicy, job_policies: Mapping[str, RetentionPolicy], now: datetime
) -> tuple[list[Action], list[Kept]]:
    protected = _protected(observed)
    groups: dict[tuple[str, Kind], list[SnapshotEntry]] = defaultdict(list)
    for m in observed.snapshots:
        if observed.jobs is None or m.job in observed.jobs:
            groups[(m.job, m.kind)].append(m)
    actions: list[Action] = []
    kept: list[Kept] = []
    for (job, kind), manifests in sorted(groups.items()):
        job_policy = job_policies.get(job, policy)
        completed = sorted(
            (m for m in manifests if m.status is SnapshotStatus.COMPLETED), key=lambda m: m.id[3:], reverse=True
        )
        reasons = _history_reasons(completed, job_policy.for_kind(kind), now)
        for m in manifests:
            if m.status is not SnapshotStatus.COMPLETED:
                reason = _leftover_reason(m, job_policy, now)
                if reason:
                    reasons[m.id] = reason
        newest = completed[0].id if completed else None
        for m in sorted(manifests, key=lambda m: m.id[3:]):
            reason = reasons.get(m.id)
            if reason is None:
                continue
            guard = _guard(m, newest, protected)
            if guard:
                kept.append(Kept(job, m.id, f"{reason}, but {guard}"))
                continue
            key = manifest_key(m.job, m.id)
            why = f"{m.status} {m.kind}: {reason}"
            actions.append(Action(ActionKind.DELETE_SNAPSHOT, m.id, why, job, (key,), version=m.version))
    return actions, kept


def _guard(m: SnapshotEntry, newest: str | None, protected: Mapping[str, str]) -> str | None:
    if m.pinned:
        return "it is pinned"
    if m.id == newest:
        return f"it is the newest COMPLETED {m.kind} of job {m.job}"
    if m.id in protected:
        return protected[m.id]
    return None


def _blob_actions(
    observed: Observed, remaining: Iterable[SnapshotEntry], policy: RetentionPolicy, now: datetime
) -> tuple[list[Action], list[str]]:
    """Deletions of unreferenced objects (with their markers) and repacks of packs that may be mostly
    unreferenced."""
    remaining = list(remaining)
    flying = [m.id for m in remaining if in_flight(m, now, policy.abandoned_after_s)]
    used: dict[str, int] = {}  # object -> the most bytes of it any one remaining snapshot references
    for m in remaining:
        for key, size in m.objects.items():
            used[key] = max(used.get(key, 0), size)
    contents = {b.key: b for b in observed.blobs if is_stored_content(b.key)}
    retired = {pack: b for b in observed.blobs if (pack := pack_of_retired(b.key))}
    cutoff, grace = now.timestamp() - policy.blob_grace_s, format_duration(policy.blob_grace_s)
    orphans = [b for b in contents.values() if b.key not in used]
    notes: list[str] = []
    old = sorted((b for b in orphans if (retired.get(b.key) or b).mtime < cutoff), key=lambda b: b.key)
    if len(old) < len(orphans):
        notes.append(f"{len(orphans) - len(old)} unreferenced objects are younger than {grace}: kept")
    doomed = {b.key for b in old}
    # markers last: a pack killed between the two keeps its grace; a marker whose pack is gone goes too
    markers = sorted(retired_key(pack) for pack in retired if pack in doomed or pack not in contents)
    actions = []
    if old or markers:
        reason = f"referenced by no remaining snapshot of any job, older than {grace}"
        keys = (*(b.key for b in old), *markers)
        actions.append(
            Action(ActionKind.DELETE_BLOBS, f"{len(old)} objects", reason, None, keys, sum(b.size for b in old))
        )
    for key, live in sorted(used.items()):
        pack = contents.get(key)
        if pack is None or not key.endswith(".pack") or pack.size == 0:
            continue
        unused = 1 - live / pack.size
        if unused > policy.max_unused and live > 0:
            reason = (
                f"up to {unused:.0%} of its {pack.size} bytes referenced by no remaining snapshot "
                f"(max unused {policy.max_unused:.0%}; the repack checks the manifests)"
            )
            actions.append(Action(ActionKind.REPACK, key, reason, None, (key,), live))
    if flying and (actions or orphans):  # nothing deleted, nothing moved: a create may reuse any content
        repacks = sum(a.kind is ActionKind.REPACK for a in actions)
        left = f"{len(orphans)} unreferenced objects and {repacks} repacks left for the next run"
        return [], [f"{left}: snapshots in flight: {', '.join(flying)}"]
    return actions, notes


def _checkpoint_actions(
    observed: Observed, policy: RetentionPolicy, job_policies: Mapping[str, RetentionPolicy], now: datetime
) -> list[Action]:
    actions = []
    for d in observed.deployments:
        if observed.jobs is not None and d.job not in observed.jobs:
            continue
        if not d.retired_at or d.state not in _FINISHED or not d.checkpoint_present:
            continue
        job_policy = job_policies.get(d.job, policy)
        retired_for = now.timestamp() - epoch_of(d.retired_at)
        if job_policy.on_cancellation is OnCancellation.DELETE:
            reason = f"deployment {d.id} is retired ({d.state}) and the policy is delete-on-cancellation"
        elif retired_for > job_policy.retired_retention_s:
            reason = (
                f"deployment {d.id} retired more than {format_duration(job_policy.retired_retention_s)} ago ({d.state})"
            )
        else:
            continue
        actions.append(Action(ActionKind.DELETE_CHECKPOINT, d.id, reason, d.job, location=d.checkpoint))
    return actions


def plan(
    observed: Observed,
    policy: RetentionPolicy | None = None,
    now: datetime | None = None,
    *,
    job_policies: Mapping[str, RetentionPolicy] | None = None,
) -> Plan:
    """Decide what to delete. Pure: the same observation, policy and `now` give the same plan.
    `policy` applies to every job without an entry in `job_policies`, and its blob grace and in-flight
    threshold apply store-wide (blobs are shared by all jobs)."""
    policy = policy or RetentionPolicy()
    job_policies = job_policies or {}
    if now is None:
        raise InvalidInput("plan() needs `now` (the planner is pure: pass datetime.now(UTC))")
    snapshot_actions, kept = _snapshot_decisions(observed, policy, job_policies, now)
    deleted = {a.target for a in snapshot_actions}
    remaining = [m for m in observed.snapshots if m.id not in deleted]
    result = Plan(actions=[*snapshot_actions, *_checkpoint_actions(observed, policy, job_policies, now)], kept=kept)
    blobs, notes = _blob_actions(observed, remaining, policy, now)
    result.actions.extend(blobs)
    result.notes.extend([*observed.notes, *notes])
    result.unrestorable = _unrestorable(observed, remaining)
    return result


def _unrestorable(observed: Observed, remaining: Iterable[SnapshotEntry]) -> list[Unrestorable]:
    """The remaining COMPLETED snapshots whose Kafka positions the broker can no longer serve."""
    marked = []
    for m in remaining:
        check = observed.source_checks.get(m.id)
        if m.status is not SnapshotStatus.COMPLETED or check is None or not check.checked or check.restorable:
            continue
        if observed.jobs is None or m.job in observed.jobs:
            reason = f"cannot be restored without losing records: {check.summary()}"
            marked.append(Unrestorable(m.job, m.id, check.records_lost, reason))
    return marked
