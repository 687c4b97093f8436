"""Retention policy: per job and kind, parsed from the jobs file's `retention` table (or CLI flags) with
errors that name the key. What the policy means is decided by the pure planner (plan.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from ..durations import duration_seconds
from ..errors import InvalidInput
from ..records.manifest import IN_FLIGHT_SECONDS, Kind


class OnCancellation(StrEnum):
    """What happens to a retired deployment's live checkpoint location (Flink's externalized checkpoints)."""

    RETAIN = "retain"  # kept for `retired_retention_s`, then deleted
    DELETE = "delete"  # deleted at the next prune once the deployment is finished


# ---------------------------------------------------------------- the policy


@dataclass(frozen=True)
class KindPolicy:
    """History limits for one kind of one job. None means no limit. A snapshot goes when it is beyond
    the newest `keep_last` unpinned COMPLETED ones OR older than `max_age_s` (Flink operator semantics:
    both limits apply), unless a safety rule keeps it."""

    keep_last: int | None = None
    max_age_s: float | None = None
    # how often a snapshot of this kind is expected (a schedule that takes them: the retention DAG's retained
    # checkpoints, a DAG of your own for savepoints); retention ignores it, `savepoints metrics` exports it
    # for alerts ("older than twice its period")
    period_s: float | None = None


@dataclass(frozen=True)
class RetentionPolicy:
    """Everything retention decides by. Defaults are the safe side: all savepoints kept, 3 retained
    checkpoints, leftovers and orphans removed only after generous grace periods."""

    checkpoint: KindPolicy = KindPolicy(keep_last=3)
    savepoint: KindPolicy = KindPolicy()
    failed_grace_s: float = 86400.0  # FAILED snapshots are kept this long for the post-mortem
    abandoned_after_s: float = float(IN_FLIGHT_SECONDS)  # IN_PROGRESS older than this was a crash
    on_cancellation: OnCancellation = OnCancellation.RETAIN
    retired_retention_s: float = 7 * 86400.0
    blob_grace_s: float = 3600.0  # unreferenced contents younger than this are left alone
    max_unused: float = 0.5  # a pack with more than this fraction of unreferenced bytes is repacked

    def for_kind(self, kind: Kind) -> KindPolicy:
        return self.checkpoint if kind is Kind.CHECKPOINT else self.savepoint

    def describe(self) -> dict[str, Any]:
        return {
            kind: {"keep_last": limits.keep_last, "max_age_s": limits.max_age_s, "period_s": limits.period_s}
            for kind, limits in (("checkpoint", self.checkpoint), ("savepoint", self.savepoint))
        } | {
            "failed_grace_s": self.failed_grace_s,
            "abandoned_after_s": self.abandoned_after_s,
            "on_cancellation": str(self.on_cancellation),
            "retired_retention_s": self.retired_retention_s,
            "blob_grace_s": self.blob_grace_s,
            "max_unused": self.max_unused,
        }


def _duration(value: Any, where: str, *, positive: bool = False) -> float:
    """A duration of the one grammar (core/durations.py: '45s', '30 minutes', '12h', '2 days', '1w') or a plain
    number of seconds (also as text: CLI flags are text)."""
    return duration_seconds(value, where, bare_unit="s", positive=positive)


def fraction(value: Any, where: str) -> float:
    """'25%' or 0.25 (also as text): a share between 0 and 1."""
    text = str(value).strip()
    try:
        if isinstance(value, bool):
            raise ValueError
        share = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise InvalidInput(f"{where} must be a fraction such as 0.25 or '25%'; got {value!r}") from None
    if not 0 <= share <= 1:
        raise InvalidInput(f"{where} must be between 0 and 1 (0% and 100%); got {value!r}")
    return share


def _keep_last(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(
            f"{where} must be a whole number >= 1 (the newest COMPLETED one is always kept); got {value!r}"
        )
    return value


def _kind_policy(raw: Any, base: KindPolicy, where: str) -> KindPolicy:
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where} must be a table such as {{ keep_last = 3, max_age = '2d' }}; got {raw!r}")
    unknown = sorted(set(raw) - {"keep_last", "max_age", "period"})
    if unknown:
        raise InvalidInput(f"{where} has unknown key(s) {', '.join(unknown)}: use keep_last, max_age and period")
    policy = base
    if "keep_last" in raw:
        policy = replace(policy, keep_last=_keep_last(raw["keep_last"], f"{where}.keep_last"))
    if "max_age" in raw:
        policy = replace(policy, max_age_s=_duration(raw["max_age"], f"{where}.max_age"))
    if "period" in raw:
        policy = replace(policy, period_s=_duration(raw["period"], f"{where}.period", positive=True))
    return policy


_DURATION_KEYS = {
    "failed_grace": "failed_grace_s",
    "abandoned_after": "abandoned_after_s",
    "retired_retention": "retired_retention_s",
    "blob_grace": "blob_grace_s",
}


def parse_policy(
    raw: Mapping[str, Any] | None, where: str = "retention", base: RetentionPolicy | None = None
) -> RetentionPolicy:
    """Validate a retention table (a job's `retention` in jobs.toml, or the CLI's flags) on top of `base`.

    retention.checkpoint = { keep_last = 3, max_age = "2d", period = "30m" }
    retention.savepoint = { keep_last = 10 }
    retention.failed_grace = "1d"; abandoned_after = "6h"; blob_grace = "1h"
    retention.on_cancellation = "retain" | "delete"; retired_retention = "7d"
    retention.max_unused = "50%"   (a pack more unused than this is repacked)
    """
    policy = base or RetentionPolicy()
    if raw is None:
        return policy
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where} must be a table of settings; got {raw!r}")
    allowed = {"checkpoint", "savepoint", "on_cancellation", "max_unused", *_DURATION_KEYS}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise InvalidInput(f"{where} has unknown key(s) {', '.join(unknown)}: allowed are {', '.join(sorted(allowed))}")
    for kind in ("checkpoint", "savepoint"):
        if kind in raw:
            policy = replace(policy, **{kind: _kind_policy(raw[kind], getattr(policy, kind), f"{where}.{kind}")})
    for key, attr in _DURATION_KEYS.items():
        if key in raw:
            policy = replace(policy, **{attr: _duration(raw[key], f"{where}.{key}")})
    if "max_unused" in raw:
        policy = replace(policy, max_unused=fraction(raw["max_unused"], f"{where}.max_unused"))
    if "on_cancellation" in raw:
        value = raw["on_cancellation"]
        if value not in {m.value for m in OnCancellation}:
            raise InvalidInput(f"{where}.on_cancellation must be 'retain' or 'delete'; got {value!r}")
        policy = replace(policy, on_cancellation=OnCancellation(value))
    if policy.abandoned_after_s <= 0:
        raise InvalidInput(f"{where}.abandoned_after must be longer than any snapshot takes; got 0")
    return policy
