"""When things happened, as every record in the store writes it: UTC, ISO 8601 to the millisecond, with a Z; and
the ids of records made at a time (snapshots, deployments, upgrades)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stamped_id(prefix: str, now: datetime | None = None) -> str:
    """Sortable by time (UTC, milliseconds), unique by a random suffix: sp-20261121T055614123Z-3f9a."""
    now = now or datetime.now(UTC)
    return f"{prefix}-{now.strftime('%Y%m%dT%H%M%S')}{now.microsecond // 1000:03d}Z-{secrets.token_hex(2)}"


def epoch_of(stamp: str) -> float:
    """Seconds since the epoch of a stamp as records write it (utc_now)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def utc_stamp(epoch: float) -> str:
    """A time in seconds since the epoch as records write it (utc_now's form)."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
