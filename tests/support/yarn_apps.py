"""YARN applications without Spark, for tests of what the engine asks YARN: an application whose container only
sleeps, submitted through the ResourceManager's REST API (seconds, where a Spark driver takes a minute)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from devtools.hadoop import MiniHadoop


def _call(hadoop: MiniHadoop, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{hadoop.rm_url}{path}?user.name=root",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read()
        return json.loads(text) if text.strip() else {}


def submit_sleeper(hadoop: MiniHadoop, seconds: int) -> str:
    """An application whose one container (its application master) runs `sleep <seconds>`, one attempt."""
    return _submit(hadoop, "savepoints-test-sleeper", f"sleep {seconds}", {"max-app-attempts": 1})


def submit_queued(hadoop: MiniHadoop) -> str:
    """An application that stays ACCEPTED: its application master is unmanaged (started outside YARN, which here
    nobody does), so YARN never gives it a container, as a busy queue would not."""
    return _submit(hadoop, "savepoints-test-queued", "true", {"unmanaged-AM": True})


def _submit(hadoop: MiniHadoop, name: str, command: str, more: dict[str, Any]) -> str:
    app_id = _call(hadoop, "POST", "/ws/v1/cluster/apps/new-application")["application-id"]
    _call(
        hadoop,
        "POST",
        "/ws/v1/cluster/apps",
        {
            "application-id": app_id,
            "application-name": name,
            "application-type": "SAVEPOINTS-TEST",
            "am-container-spec": {"commands": {"command": command}},
            "resource": {"memory": 128, "vCores": 1},
            **more,
        },
    )
    return app_id


def container_processes(hadoop: MiniHadoop, command: list[str]) -> list[int]:
    """The pids of processes running `command` in a container of this cluster (descendants of its JVM)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "cmdline").read_bytes().split(b"\0")[:-1] != [part.encode() for part in command]:
                continue
            pid = int(proc.name)
            while pid > 1 and pid != hadoop.pid:
                pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if pid == hadoop.pid:
            found.append(int(proc.name))
    return found
