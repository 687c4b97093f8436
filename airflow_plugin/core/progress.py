"""Progress reporting: the engine calls it, the CLI draws it (rich), Airflow logs it. Two kinds: transfers
(`start`, `advance`, `finish`: files and bytes) and stages of a longer wait (`stage`: launching a job,
waiting for its Spark session, for its first batch), shown until the next stage or `finish`."""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

log = logging.getLogger(__name__)


class Progress(Protocol):
    def start(self, description: str, total_bytes: int, total_files: int) -> None: ...

    def advance(self, nbytes: int) -> None:
        """One file done (thread-safe): `nbytes` of it counted."""

    def stage(self, text: str) -> None:
        """What a longer operation waits for now; called again with the same text while it still waits."""

    def finish(self) -> None:
        """The transfer, or the stages, are over."""


class NullProgress:
    def start(self, description: str, total_bytes: int, total_files: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def stage(self, text: str) -> None:
        pass

    def finish(self) -> None:
        pass


class LogProgress:
    """For non-interactive callers (Airflow task logs): a line at most every `interval` seconds, and one
    line per stage."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._transfer = False
        self._stage = ""

    def start(self, description: str, total_bytes: int, total_files: int) -> None:
        self.description, self.total_bytes, self.total_files = description, total_bytes, total_files
        self.done_bytes = self.done_files = 0
        self._last = time.monotonic()
        self._transfer = True

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.done_bytes += nbytes
            self.done_files += 1
            if time.monotonic() - self._last >= self.interval:
                self._last = time.monotonic()
                log.info(
                    "%s: %d/%d files, %d/%d bytes",
                    self.description,
                    self.done_files,
                    self.total_files,
                    self.done_bytes,
                    self.total_bytes,
                )

    def stage(self, text: str) -> None:
        if text != self._stage:
            self._stage = text
            log.info("%s", text)

    def finish(self) -> None:
        if self._transfer:
            log.info("%s: done, %d files, %d bytes", self.description, self.total_files, self.total_bytes)
        self._transfer, self._stage = False, ""
