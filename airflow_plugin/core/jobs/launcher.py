"""Launch a streaming job detached: nothing ever blocks on spark-submit.

Local master and client deploy mode: spark-submit runs the driver itself, so it is started as a
detached process in its own session (its own process group, so that a force-kill reaches the JVM and
the Python driver), logging to a file; pid and start time are recorded. Cluster deploy modes use the
cluster's own detach switch: spark-submit returns once the cluster accepted the application, and the id the
cluster gives back (standalone driver id, YARN application id, Kubernetes driver pod) is recorded
(`submitted`). A YARN application is force-killed through YARN's ResourceManager (yarn.py); on YARN a
managed deployment gets one application attempt unless its conf says otherwise (CLUSTER_DEFAULTS: why).
The spark-submit command itself comes from a `CommandBuilder`: by default the one here; the Airflow layer
passes one built by the Spark provider's SparkSubmitHook."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..errors import LaunchFailed
from ..process import Liveness, ProcessId
from ..spark_app import check_pyspark_files, loopback_env, spark_submit_binary
from . import yarn

DETACH_CONF = {  # cluster managers' own "do not wait for the application" switches
    "yarn": {"spark.yarn.submit.waitAppCompletion": "false"},
    "k8s": {"spark.kubernetes.submission.waitAppCompletion": "false"},
    "spark": {"spark.standalone.submit.waitAppCompletion": "false"},
}
# What a managed deployment gets on a cluster unless its own conf says otherwise. YARN's default is two attempts
# of the driver: a second attempt restarts the query from the deployment's checkpoint (exactly-once holds:
# tests/e2e/test_yarn_e2e.py), but it also repeats a deterministic failure (a refused start, an incompatible
# state), and between the attempts the deployment reads FAILED while its next driver starts: an upgrade's
# health gate would roll back while that driver comes up and writes the same sink. One attempt keeps a FAILED
# deployment final; the engine's own restart (`deploy --restore latest-state`) recovers it.
CLUSTER_DEFAULTS = {"yarn": {"spark.yarn.maxAppAttempts": "1"}}
SUBMIT_TIMEOUT = 300.0  # seconds for a cluster-mode spark-submit to hand the application over (uploads included)
_CLUSTER_IDS = {
    "driver_id": re.compile(r"\b(driver-\d{14}-\d{4})\b"),
    "app_id": re.compile(r"\b(application_\d+_\d+)\b"),
    "driver_pod": re.compile(r"pod name: (\S+)"),
}
_SECRET_CONF = re.compile(r"secret|password|token|credential|access\.key", re.IGNORECASE)


@dataclass(frozen=True)
class SubmitSpec:
    application: str
    app_args: list[str]
    master: str = "local[2]"
    deploy_mode: str = "client"
    name: str = "savepoints-job"
    conf: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def cluster_manager(self) -> str:
        return "local" if self.master.startswith("local") else self.master.split(":", 1)[0]

    @property
    def detached_by_cluster(self) -> bool:
        return self.deploy_mode == "cluster" and self.cluster_manager in DETACH_CONF


CommandBuilder = Callable[[SubmitSpec], list[str]]


def default_command(spec: SubmitSpec) -> list[str]:
    command = [spark_submit_binary(), "--master", spec.master, "--deploy-mode", spec.deploy_mode, "--name", spec.name]
    conf = dict(spec.conf)
    if spec.detached_by_cluster:
        conf.update(DETACH_CONF[spec.cluster_manager])
        conf = {**CLUSTER_DEFAULTS.get(spec.cluster_manager, {}), **conf}
    for key, value in sorted(conf.items()):
        command += ["--conf", f"{key}={value}"]
    return [*command, spec.application, *spec.app_args]


def redact(command: list[str]) -> list[str]:
    """The command as it may be logged and stored: secret conf values hidden."""
    shown = []
    for part in command:
        key, sep, _ = part.partition("=")
        shown.append(f"{key}=***" if sep and _SECRET_CONF.search(key) else part)
    return shown


_children: dict[int, subprocess.Popen[bytes]] = {}  # reaped by process_seen() so they do not linger as zombies


def launch(spec: SubmitSpec, log_path: Path, build: CommandBuilder = default_command) -> dict[str, Any]:
    """Start spark-submit detached; return the handle to store in the deployment record."""
    check_pyspark_files()
    command = build(spec)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # The builder may take master and deploy mode from elsewhere (an Airflow connection): use the real ones.
    master = _option(command, "--master") or spec.master
    deploy_mode = _option(command, "--deploy-mode") or spec.deploy_mode
    # spec.env carries the store's S3 access (the job context's): the driver reaches the store as we do
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        **loopback_env(master),
        **spec.env,
    }
    with log_path.open("ab") as log:
        try:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LaunchFailed(f"could not start {command[0]}: {exc}") from None
    _children[process.pid] = process
    manager = "local" if master.startswith("local") else master.split(":", 1)[0]
    return {
        "mode": "cluster" if deploy_mode == "cluster" else manager,
        "master": master,
        "deploy_mode": deploy_mode,
        "host": socket.gethostname(),  # for people: a pid means something only in its boot and PID namespace
        **ProcessId.of(process.pid).to_dict(),  # pid, boot_id, pid_namespace, started
        "log": str(log_path),
        "command": redact(command),
    }


def driver_process(handle: dict[str, Any]) -> ProcessId | None:
    """The driver process a local or client-mode launch started (None: a cluster's, or no pid recorded)."""
    return None if handle.get("mode") == "cluster" else ProcessId.from_handle(handle)


def _option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command[:-1] else None


def process_seen(handle: dict[str, Any]) -> Liveness:
    """Whether the driver process of a local/client-mode handle runs: ALIVE or GONE where this process can look
    (the same boot and PID namespace: `ProcessId.look`), else UNKNOWN (another machine or container, a cluster's
    driver): only the heartbeat and the fence (core/jobs/fence.py) speak for it then."""
    process = driver_process(handle)
    if process is None:
        return Liveness.UNKNOWN
    seen = process.look()
    child = _children.get(process.pid)
    if seen is Liveness.ALIVE and child is not None and child.poll() is not None:  # ours, ended: reaped now
        return Liveness.GONE
    return seen


def exit_code(handle: dict[str, Any]) -> int | None:
    """The exit code, if this process started the job and it has ended. In cluster mode spark-submit returns
    once the application is accepted, so the job has ended when the cluster says so: on YARN, 0 if the
    application SUCCEEDED, 1 if it failed or was killed (a spark-submit that failed before that: its own code)."""
    child = _children.get(handle.get("pid", -1))
    code = None if child is None else child.poll()
    if code != 0 or (app_id := yarn_application(handle)) is None:
        return code
    report = yarn.application_report(app_id)
    if report is not None and not report.ended:
        return None
    return 0 if report is not None and report.final_status == "SUCCEEDED" else 1


def cluster_ids(log_text: str) -> dict[str, str]:
    """Ids a cluster-mode spark-submit prints once the application is submitted."""
    return {name: m.group(1) for name, pattern in _CLUSTER_IDS.items() if (m := pattern.search(log_text))}


def submitted(handle: dict[str, Any], timeout: float = SUBMIT_TIMEOUT) -> dict[str, str]:
    """For a cluster-mode handle: wait until spark-submit has handed the application to the cluster (it returns
    once accepted) and return the ids it printed (`app_id` on YARN); LaunchFailed if it fails or hangs. Other
    handles: nothing to wait for."""
    child = _children.get(handle.get("pid", -1))
    if handle.get("mode") != "cluster" or child is None:
        return {}
    try:
        code = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LaunchFailed(
            f"spark-submit ({handle['master']}, cluster mode) did not hand the application over within {timeout:.0f} s "
            f"(log {handle.get('log')}):\n{log_tail(handle)}"
        ) from None
    ids = cluster_ids(log_tail(handle, 500))
    if code != 0 or not ids:
        raise LaunchFailed(
            f"spark-submit ({handle['master']}, cluster mode) exited with code {code} "
            f"{'without naming the application' if code == 0 else 'before the cluster accepted the application'} "
            f"(log {handle.get('log')}):\n{log_tail(handle)}"
        )
    return ids


def log_tail(handle: dict[str, Any], lines: int = 20) -> str:
    try:
        text = Path(handle["log"]).read_text(errors="replace")
    except (OSError, KeyError):
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def yarn_application(handle: dict[str, Any]) -> str | None:
    """The YARN application id of a cluster-mode launch on YARN: recorded once submitted (`submitted`), else read
    from spark-submit's log (a pre-flight run keeps only its handle)."""
    if handle.get("mode") != "cluster" or not str(handle.get("master", "")).startswith("yarn"):
        return None
    return handle.get("app_id") or cluster_ids(log_tail(handle, 500)).get("app_id")


def driver_ended(handle: dict[str, Any]) -> bool | None:
    """Whether a driver is known to have ended: its process gone (a local or client-mode driver this process can
    see), its YARN application ended. None where this process cannot tell (a cluster-mode application of another
    manager, a driver on another machine or in another container): only its own last status says so then."""
    if (app_id := yarn_application(handle)) is not None:
        report = yarn.application_report(app_id)
        return None if report is None else report.ended
    seen = process_seen(handle)
    return None if seen is Liveness.UNKNOWN else seen is Liveness.GONE


class Killed(StrEnum):
    KILLED = "killed"
    ENDED = "already ended"
    UNREACHABLE = "cannot be killed from here"  # another machine or container: fence it instead (jobs/fence.py)


def force_kill(handle: dict[str, Any]) -> Killed:
    """End a job by force: the whole process group of a local/client-mode job (SIGKILL), a YARN application
    through YARN's ResourceManager. UNREACHABLE for a driver this process cannot see (`process_seen`)."""
    if (app_id := yarn_application(handle)) is not None:
        manager = yarn.resource_manager()
        report = manager.application(app_id)
        if report is None or report.ended:
            return Killed.ENDED
        manager.kill(app_id)
        return Killed.KILLED
    if handle.get("mode") == "cluster":
        raise LaunchFailed(
            f"force-kill of a {handle.get('master')} cluster-mode application is not done from here: "
            f"use the cluster's tools (ids: {cluster_ids(log_tail(handle, 200))})"
        )
    seen = process_seen(handle)
    if seen is not Liveness.ALIVE:
        return Killed.ENDED if seen is Liveness.GONE else Killed.UNREACHABLE
    os.killpg(handle["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_seen(handle) is Liveness.ALIVE and time.monotonic() < deadline:
        time.sleep(0.05)
    return Killed.KILLED
