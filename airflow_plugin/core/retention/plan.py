"""Retention, deciding: the PURE planner that turns what the store holds into a plan of deletions, each
with its reason. No I/O here: `prune.py` observes the store into `Observed` and executes the `Plan`; a
dry run prints the plan and stops (observe, decide, act).

Safety rules the planner never breaks, whatever the policy says:
- the newest COMPLETED snapshot of a job and kind is kept;
- a pinned snapshot is kept;
- a snapshot that a live (or LOST: it may still run) deployment was restored from is kept;
- a blob is deleted only when no REMAINING manifest of any job (any status) references it, it is older
  than the GC grace period, and no snapshot is in flight (a create writes its IN_PROGRESS manifest
  before it looks at what the store holds, so while one runs it may be about to reuse any blob).

The plan also marks the snapshots that can no longer be restored without losing records because Kafka no
longer holds what they would read next (`Observed.source_checks`, from the broker: snapshots/source_guard.py).

(Over 300 lines: the observation, the plan and the rules that join them are one reading.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from ..errors import InvalidInput
from ..jobs.deployments import State
from ..layout import manifest_key
from ..snapshots.manifest import Kind, Manifest, SnapshotStatus, in_flight
from ..sources.kafka import SourceCheck
from ..storage import ObjectInfo
from .policy import KindPolicy, OnCancellation, RetentionPolicy

# A deployment whose state is one of these may still be running: what it was restored from is kept.
_MAYBE_RUNNING = tuple(str(s) for s in State if s.live or s is State.LOST)
_FINISHED = tuple(str(s) for s in State if not s.live and s is not State.LOST)


class ActionKind(StrEnum):
    DELETE_SNAPSHOT = "delete-snapshot"
    DELETE_BLOBS = "delete-blobs"
    DELETE_CHECKPOINT = "delete-checkpoint"


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
    """What the store holds. `manifests` are ALL jobs' (blob references are store-wide); `jobs` limits
    which jobs' snapshots and deployments the plan may touch (None: every job)."""

    manifests: tuple[Manifest, ...]
    deployments: tuple[ObservedDeployment, ...] = ()
    blobs: tuple[ObjectInfo, ...] = ()
    jobs: frozenset[str] | None = None
    source_checks: Mapping[str, SourceCheck] = field(default_factory=dict)  # snapshot id -> its Kafka positions


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Action:
    """One deletion. `keys` are store keys (a manifest, blobs); a checkpoint action names its location."""

    kind: ActionKind
    target: str
    reason: str
    job: str | None = None
    keys: tuple[str, ...] = ()
    bytes: int = 0
    location: str | None = None

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
                "bytes": sum(a.bytes for a in self.actions if a.kind is not ActionKind.DELETE_SNAPSHOT),
            },
        }

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(action, job, target, reason) for a table: deletions first, then what safety rules kept."""
        rows = [(str(a.kind), a.job or "*", a.target, a.reason) for a in self.actions]
        rows += [("keep", k.job, k.snapshot, k.reason) for k in self.kept]
        rows += [("unrestorable", u.job, u.snapshot, u.reason) for u in self.unrestorable]
        return rows


# ---------------------------------------------------------------- the planner


def _timestamp(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def age_seconds(manifest: Manifest, now: datetime) -> float:
    return now.timestamp() - _timestamp(manifest.created_at)


def _human(seconds: float) -> str:
    for unit, length in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{int(seconds // length)}{unit}"
    return f"{seconds:g}s"


def _protected(observed: Observed) -> dict[str, str]:
    """Snapshot id -> why a deployment needs it: restored from by one that is, or may be, running."""
    return {
        d.restored_from: f"deployment {d.id} ({d.state}) was restored from it"
        for d in observed.deployments
        if d.restored_from and d.state in _MAYBE_RUNNING
    }


def _leftover_reason(m: Manifest, policy: RetentionPolicy, now: datetime) -> str | None:
    age = age_seconds(m, now)
    if m.status is SnapshotStatus.FAILED and age > policy.failed_grace_s:
        return f"FAILED, older than the grace period ({_human(policy.failed_grace_s)})"
    if m.status is SnapshotStatus.IN_PROGRESS and age > policy.abandoned_after_s:
        return f"IN_PROGRESS for longer than {_human(policy.abandoned_after_s)}: abandoned by a crash"
    return None


def _history_reasons(completed: list[Manifest], limits: KindPolicy, now: datetime) -> dict[str, str]:
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
            reasons[m.id] = f"older than max age {_human(limits.max_age_s)}"
    return reasons


def _snapshot_decisions(
    observed: Observed, policy: RetentionPolicy, job_policies: Mapping[str, RetentionPolicy], now: datetime
) -> tuple[list[Action], list[Kept]]:
    protected = _protected(observed)
    groups: dict[tuple[str, Kind], list[Manifest]] = defaultdict(list)
    for m in observed.manifests:
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
            actions.append(Action(ActionKind.DELETE_SNAPSHOT, m.id, f"{m.status} {m.kind}: {reason}", job, (key,)))
    return actions, kept


def _guard(m: Manifest, newest: str | None, protected: Mapping[str, str]) -> str | None:
    if m.pinned:
        return "it is pinned"
    if m.id == newest:
        return f"it is the newest COMPLETED {m.kind} of job {m.job}"
    if m.id in protected:
        return protected[m.id]
    return None


def _blob_action(
    observed: Observed, remaining: Iterable[Manifest], policy: RetentionPolicy, now: datetime
) -> tuple[Action | None, str | None]:
    remaining = list(remaining)
    flying = [m.id for m in remaining if in_flight(m, now, policy.abandoned_after_s)]
    referenced = {entry.blob for m in remaining for entry in m.files}
    cutoff = now.timestamp() - policy.blob_grace_s
    orphans = [b for b in observed.blobs if b.key not in referenced]
    old = sorted((b for b in orphans if b.mtime < cutoff), key=lambda b: b.key)
    if flying and orphans:
        return (
            None,
            f"{len(orphans)} unreferenced blobs left for the next run: snapshots in flight: {', '.join(flying)}",
        )
    note = None
    if len(old) < len(orphans):
        note = f"{len(orphans) - len(old)} unreferenced blobs are younger than {_human(policy.blob_grace_s)}: kept"
    if not old:
        return None, note
    reason = f"referenced by no remaining snapshot of any job, older than {_human(policy.blob_grace_s)}"
    action = Action(
        ActionKind.DELETE_BLOBS, f"{len(old)} blobs", reason, None, tuple(b.key for b in old), sum(b.size for b in old)
    )
    return action, note


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
        retired_for = now.timestamp() - _timestamp(d.retired_at)
        if job_policy.on_cancellation is OnCancellation.DELETE:
            reason = f"deployment {d.id} is retired ({d.state}) and the policy is delete-on-cancellation"
        elif retired_for > job_policy.retired_retention_s:
            reason = f"deployment {d.id} retired more than {_human(job_policy.retired_retention_s)} ago ({d.state})"
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
    remaining = [m for m in observed.manifests if m.id not in deleted]
    result = Plan(actions=[*snapshot_actions, *_checkpoint_actions(observed, policy, job_policies, now)], kept=kept)
    blobs, note = _blob_action(observed, remaining, policy, now)
    if blobs:
        result.actions.append(blobs)
    if note:
        result.notes.append(note)
    result.unrestorable = _unrestorable(observed, remaining)
    return result


def _unrestorable(observed: Observed, remaining: Iterable[Manifest]) -> list[Unrestorable]:
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
