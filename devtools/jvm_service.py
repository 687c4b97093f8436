"""What the embedded JVM services for tests and the demo share (the Kafka broker, devtools/kafka.py; the mini
Hadoop cluster, devtools/hadoop.py): their life as a child JVM (JvmService), free ports on 127.0.0.1, a JVM's output
without its stack frames, and a stop that always ends the process."""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Self


def without_stack_frames(text: str, lines: int = 40) -> str:
    """The last lines of a JVM's output without the "at ..." frames, which bury the exception's message."""
    return "\n".join([line for line in text.strip().splitlines() if not line.startswith("\tat ")][-lines:])


def end_process(
    process: subprocess.Popen[bytes], ask: Callable[[], None], timeout: float, name: str, log: logging.Logger
) -> None:
    """`ask` the service to stop and wait `timeout` seconds; then SIGTERM (if `ask` was something else) and wait
    again; then SIGKILL. A second Ctrl-C that cuts a wait short still ends in SIGKILL."""
    try:
        if process.poll() is None:
            ask()
            process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        if ask == process.terminate:
            log.warning("%s ignored SIGTERM for %.0f s: killing it", name, timeout)
        else:
            log.warning("%s did not stop in %.0f s: terminating it", name, timeout)
            process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0f s: killing it", name, timeout)
    finally:
        if process.poll() is None:  # SIGTERM ignored, or a second Ctrl-C cut the wait short
            process.kill()
            process.wait()


class JvmService(ABC):
    """One JVM child process for the tests and the demo: started in a temporary directory of its own, on free
    ports (on new ones when another process took one before the JVM bound it), its output in a log file there;
    ended by stop(), also on leaving the `with` and on Ctrl-C (asked, then SIGTERM, then SIGKILL: end_process),
    its directory deleted. A subclass says what it is, how it is launched and how it is asked to stop."""

    what: ClassVar[str]  # "the embedded Kafka broker": the subject of every message
    error: ClassVar[type[RuntimeError]]
    dir_prefix: ClassVar[str]
    log_name: ClassVar[str]
    stop_timeout: ClassVar[float]
    port_attempts: ClassVar[int] = 3  # a free port picked here can be taken by another process before the JVM binds it

    def __init__(self, start_timeout: float) -> None:
        self.start_timeout = start_timeout
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # --- what a service says

    @abstractmethod
    def _java_command(self) -> list[str]:
        """The JVM and its options, up to the main class; raises `error` when Java is missing."""

    @abstractmethod
    def _launch(self, command: list[str]) -> bool:
        """Start the JVM on new ports (`_spawn`, then `_wait_until`); False when another process took one."""

    def _started(self) -> None:
        """Once it is up: what its clients need, written."""
        return None

    def _stop_request(self, process: subprocess.Popen[bytes]) -> Callable[[], None]:
        """How the JVM is asked to stop before SIGTERM."""
        return process.terminate

    def _after_stop(self) -> None:
        """What may outlive the JVM, ended (its directory still there)."""
        return None

    # --- lifecycle

    def start(self) -> Self:
        command = self._java_command()
        self._dir = Path(tempfile.mkdtemp(prefix=self.dir_prefix))
        try:
            for attempt in range(1, self.port_attempts + 1):
                self._end_process()
                if self._launch(command):
                    self._started()
                    return self
                self._logger.warning("%s: ports taken before it bound them (attempt %d): new ports", self.what, attempt)
            raise self.error(f"{self.what} found no free ports in {self.port_attempts} attempts")
        except BaseException:  # Ctrl-C included: never leave a JVM behind
            self.stop()
            raise

    def _spawn(
        self,
        command: list[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        stdin: int = subprocess.DEVNULL,
    ) -> None:
        self._log = self.log_path.open("wb")  # this attempt's log only: its port check reads it
        self._process = subprocess.Popen(
            command,
            cwd=cwd,
            stdin=stdin,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches Python only, which then stops the JVM
        )

    def _wait_until(self, ready: Callable[[], bool], deadline: float, tail: int = 200) -> bool:
        """Polls `ready` until `deadline`; False if a port was taken (the JVM exited saying so), `error` with the
        log's last lines if the JVM died or did not come up in time."""
        assert self._process is not None
        while time.monotonic() < deadline:
            if ready():
                return True
            try:
                code = self._process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            if "Address already in use" in self.log_tail(tail):
                return False
            raise self.error(
                f"{self.what} exited with code {code} while starting (log: {self.log_path}):\n"
                f"{without_stack_frames(self.log_tail(tail))}"
            )
        raise self.error(
            f"{self.what} did not come up within {self.start_timeout:.0f} s (log: {self.log_path}):\n"
            f"{without_stack_frames(self.log_tail(tail))}"
        )

    def stop(self) -> None:
        self._end_process()
        self._after_stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _end_process(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            end_process(process, self._stop_request(process), self.stop_timeout, self.what, self._logger)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | None) -> None:
        self.stop()

    # --- facts

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def _started_dir(self) -> Path:
        if self._dir is None:
            raise self.error(f"{self.what} is not started: use `with {type(self).__name__}() as service:`")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self._started_dir / self.log_name

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    @property
    def _logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)
