"""How long a stop waits for the running batch before interrupting it (spark_jobs/runtime/control.py)."""

from __future__ import annotations

import pytest

from spark_jobs.runtime.control import DRAIN_BOUNDARY_WAIT, MAX_BOUNDARY_WAIT, boundary_wait


@pytest.mark.parametrize(
    ("interval", "last_batch", "expected"),
    [
        (5.0, 0.8, 5.0),  # on schedule: one interval
        (0.2, 0.1, 1.0),  # never less than a second
        (1.0, 10.0, 15.0),  # batches longer than the interval: the batch is let finish
        (1.0, 100.0, 1.0 + MAX_BOUNDARY_WAIT),  # but not beyond the engine's patience
        (None, 10.0, DRAIN_BOUNDARY_WAIT),  # available-now: no interval
    ],
)
def test_a_stop_lets_a_slow_batch_finish_within_bounds(
    interval: float | None, last_batch: float, expected: float
) -> None:
    assert boundary_wait(interval, last_batch) == pytest.approx(expected)
