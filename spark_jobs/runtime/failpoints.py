"""Failpoints: the exact points where a test ends, pauses or lines up drivers, points no outside observer can hit in
time (the moment between green's publish commit and its answer lasts milliseconds). `SAVEPOINTS_FAILPOINTS` names
them, comma-separated: `name=kill` (SIGKILL), `name=stop` (SIGSTOP: paused until a SIGCONT or a kill), or
`name=meet:DIR` (the n-th time this process reaches it, it waits until another process reached it for the n-th time
too, DIR being a local directory they share: two drivers then go on together, e.g. both to commit one table's next
log version at once). Only tests set it, and unset, reaching a failpoint costs one lookup."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "SAVEPOINTS_FAILPOINTS"
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
MEET_TIMEOUT = 60.0  # a process that waits longer for the other goes on alone (the other may be gone)
_reached: dict[str, int] = {}  # how often this process reached each `meet` failpoint


def failpoint(name: str) -> None:
    """End, pause or line up this process here if the environment names this failpoint."""
    armed = dict(item.split("=", 1) for item in os.environ.get(ENV, "").split(",") if "=" in item)
    if name not in armed:
        return
    action, _, argument = armed[name].partition(":")
    log.warning("failpoint %s: %s", name, armed[name])
    if action == "meet":
        meet(name, Path(argument))
    else:
        os.kill(os.getpid(), SIGNALS[action])


def meet(name: str, directory: Path, timeout: float = MEET_TIMEOUT) -> bool:
    """Wait until another process arrived here as often as this one (files `<name>.<n>.<pid>` in `directory`);
    False when none did within `timeout`."""
    arrival = _reached[name] = _reached.get(name, 0) + 1
    directory.mkdir(parents=True, exist_ok=True)
    mine = f"{name}.{arrival}.{os.getpid()}"
    (directory / mine).touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(path.name != mine for path in directory.glob(f"{name}.{arrival}.*")):
            return True
        time.sleep(0.005)
    log.warning("failpoint %s: no other process arrived within %.0fs; going on alone", name, timeout)
    return False
