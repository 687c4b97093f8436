"""A migration function that is wrong on purpose, for the end-to-end test and the demo: it returns the example's
migrated state with one key twice. The upgrade must stop before anything starts, naming the function and the
key, and leave the running version alone."""

from __future__ import annotations

from typing import Any

from spark_jobs.jobs.windowed.migrations import per_country


def twice(old: Any) -> Any:
    state = per_country(old)
    return state.unionByName(state.limit(1))
