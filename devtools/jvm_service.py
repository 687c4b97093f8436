"""What the embedded JVM services for tests and the demo share (the Kafka broker, devtools/kafka.py; the mini
Hadoop cluster, devtools/hadoop.py): free ports on 127.0.0.1, a JVM's output without its stack frames, and a stop
that always ends the process."""

from __future__ import annotations

import logging
import socket
import subprocess
from collections.abc import Callable


def free_ports(count: int) -> list[int]:
    """`count` different ports free on 127.0.0.1 now (another process may take one before the service binds it)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))  # all bound at once: the ports differ
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


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
