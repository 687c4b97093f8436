"""When things happened, as every record in the store writes it: UTC, ISO 8601 to the millisecond, with a Z."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
