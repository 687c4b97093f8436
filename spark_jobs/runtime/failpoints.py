"""Failpoints: the exact points where a test ends or pauses this driver, points no outside observer can hit in
time (the moment between green's publish commit and its answer lasts milliseconds). `SAVEPOINTS_FAILPOINTS` names
them, `name=kill` (SIGKILL) or `name=stop` (SIGSTOP: paused until a SIGCONT or a kill), comma-separated; only tests
set it, and unset, reaching a failpoint costs one lookup."""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "SAVEPOINTS_FAILPOINTS"
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def failpoint(name: str) -> None:
    """End or pause this process here if the environment names this failpoint."""
    armed = dict(item.split("=", 1) for item in os.environ.get(ENV, "").split(",") if "=" in item)
    if name in armed:
        log.warning("failpoint %s: %s", name, armed[name])
        os.kill(os.getpid(), SIGNALS[armed[name]])
