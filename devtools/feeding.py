"""Feeding a running example job from a thread while DAGs or commands run (the scenario, the benchmarks): the
file job's Feeder (devtools/windowed.py) and the Kafka job's KafkaFeeder (devtools/kafka_job.py) alike."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable


class Feeds(Protocol):
    def round(self) -> None: ...


@runtime_checkable
class Poisons(Protocol):
    """A feeder that can also write a poison event (the example jobs' `poisoned` versions fail on it)."""

    def round(self) -> None: ...

    def poison(self) -> None: ...


class BackgroundFeeder:
    """Feeds a round of events every `interval` seconds on a thread, until stopped. While `poisoning`, it
    writes one poison event as soon as its condition holds, and then feeds nothing more until the block
    ends (so the poisoned version reaches the poison within a few batches)."""

    def __init__(self, feeder: Feeds, interval: float = 1.5) -> None:
        self.feeder, self.interval = feeder, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self._poison_when: Callable[[], bool] | None = None
        self._poisoned = threading.Event()
        self._idle = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self._idle.is_set():
                continue
            condition = self._poison_when
            if condition is None:
                self.feeder.round()
            elif not self._poisoned.is_set():
                if condition():
                    assert isinstance(self.feeder, Poisons)  # poisoning() refuses a feeder without poison()
                    self.feeder.poison()
                    self._poisoned.set()
                else:
                    self.feeder.round()

    @contextmanager
    def poisoning(self, condition: Callable[[], bool]) -> Iterator[threading.Event]:
        """Poison once `condition()` holds; yields the event that is set when it was written."""
        if not isinstance(self.feeder, Poisons):
            raise TypeError(f"{type(self.feeder).__name__} writes no poison event: it has no poison()")
        self._poisoned.clear()
        self._poison_when = condition
        try:
            yield self._poisoned
        finally:
            self._poison_when = None

    @contextmanager
    def idle(self) -> Iterator[None]:
        """No round while the block runs: input stops, and comes again after it."""
        self._idle.set()
        try:
            yield
        finally:
            self._idle.clear()

    def __enter__(self) -> BackgroundFeeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
