"""Progress reporting for long transfers: the engine calls it, the CLI draws it (rich), Airflow logs it."""

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

    def finish(self) -> None: ...


class NullProgress:
    def start(self, description: str, total_bytes: int, total_files: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def finish(self) -> None:
        pass


class LogProgress:
    """For non-interactive callers (Airflow task logs): a line at most every `interval` seconds."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()

    def start(self, description: str, total_bytes: int, total_files: int) -> None:
        self.description, self.total_bytes, self.total_files = description, total_bytes, total_files
        self.done_bytes = self.done_files = 0
        self._last = time.monotonic()

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

    def finish(self) -> None:
        log.info("%s: done, %d files, %d bytes", self.description, self.total_files, self.total_bytes)
