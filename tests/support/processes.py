"""Process identities for tests (core/process.py): a driver handle whose process is gone, one that lives in a PID
namespace this process cannot look into."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

from airflow_plugin.core.process import ProcessId


def ended_process() -> ProcessId:
    """The identity of a process of this namespace that has just ended (taken while it ran: a pid alone could
    be reused by a live process by the time a test looks)."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    identity = ProcessId.of(process.pid)
    process.communicate(b"")
    return identity


def gone_handle() -> dict[str, Any]:
    """A local driver's launcher handle whose process is gone."""
    return {"mode": "local", "host": "this", **ended_process().to_dict()}


def elsewhere_handle() -> dict[str, Any]:
    """A local driver's handle of a process in another PID namespace (a container on this host): this process's own
    pid, which runs, but another namespace's, so nobody here can tell whether it runs."""
    here = ProcessId.current()
    return {"mode": "local", "host": "this", **replace(here, namespace="1").to_dict()}
