"""YARN's ResourceManager through its REST API (`/ws/v1/cluster/apps/<id>`): what it says of a deployment's
application, and a kill. A deployment launched in cluster mode on YARN records its application id
(launcher.py); the driver then runs in a YARN container, so YARN is the one witness of a driver that died
without writing its heartbeat (its container killed, its node lost, the application killed by someone with
`yarn application -kill`) and the one way to end it by force.

Where the ResourceManager is, and as whom: core/hadoop_conf.py (HADOOP_CONF_DIR, as spark-submit reads it).
Plain HTTP (urllib): two requests, no client library needed. With HA the ResourceManagers are tried in their
configured order; a standby one answers with a redirect, which is followed for reads."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from .. import hadoop_conf
from ..errors import ClusterUnavailable

ENDED = ("FINISHED", "FAILED", "KILLED")
QUEUED = frozenset({"NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED"})  # its driver not started yet: it writes nothing
REQUEST_TIMEOUT = 10.0
KILL_TIMEOUT = 60.0
REPORT_TTL = 2.0  # seconds a report is reused: waits poll the store often, the ResourceManager at most this often
_recent: dict[str, tuple[float, AppReport | ClusterUnavailable | None]] = {}


@dataclass(frozen=True)
class AppReport:
    """The ResourceManager's record of one application."""

    app_id: str
    state: str  # NEW, NEW_SAVING, SUBMITTED, ACCEPTED, RUNNING, FINISHED, FAILED, KILLED
    final_status: str  # UNDEFINED while it runs; SUCCEEDED, FAILED, KILLED
    diagnostics: str = ""
    driver_logs: str | None = None  # the driver's (application master's) container logs, on its NodeManager

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def queued(self) -> bool:
        return self.state in QUEUED

    @classmethod
    def from_json(cls, app: dict[str, Any]) -> AppReport:
        return cls(
            app_id=app["id"],
            state=app.get("state", ""),
            final_status=app.get("finalStatus", ""),
            diagnostics=(app.get("diagnostics") or "").strip(),
            driver_logs=app.get("amContainerLogs"),
        )

    def summary(self) -> str:
        """How YARN ended the application, for a deployment's error: its state, final status and diagnostics."""
        logs = f" (driver logs: {self.driver_logs})" if self.driver_logs else ""
        diagnostics = f": {self.diagnostics}" if self.diagnostics else ""
        return f"YARN application {self.app_id} is {self.state} ({self.final_status}){diagnostics}{logs}"


class ResourceManager:
    def __init__(self, urls: list[str], user: str) -> None:
        self.urls, self.user = urls, user

    def application(self, app_id: str) -> AppReport | None:
        """The application's record; None when the ResourceManager does not know it (long finished and
        forgotten, or the ResourceManager restarted without recovery)."""
        try:
            answer = self._request("GET", f"/ws/v1/cluster/apps/{app_id}")
        except FileNotFoundError:
            return None
        return AppReport.from_json(answer["app"])

    def kill(self, app_id: str, timeout: float = KILL_TIMEOUT) -> AppReport:
        """Ask YARN to kill the application (as `yarn application -kill` does) and wait until it has ended;
        an application that already ended is returned as it is."""
        report = self.application(app_id)
        if report is None:
            raise ClusterUnavailable(f"YARN does not know application {app_id}: nothing to kill through YARN")
        if not report.ended:
            self._request("PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"})
        deadline = time.monotonic() + timeout
        while not report.ended:
            if time.monotonic() > deadline:
                raise ClusterUnavailable(
                    f"YARN accepted the kill of application {app_id} but it is still {report.state} after "
                    f"{timeout:.0f} s: check it with `yarn application -status {app_id}`"
                )
            time.sleep(0.5)
            report = self.application(app_id) or report
        return report

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        query = urllib.parse.urlencode({"user.name": self.user})  # simple authentication: who asks
        problems = []
        for url in self.urls:
            request = urllib.request.Request(
                f"{url}{path}?{query}",
                data=json.dumps(body).encode() if body is not None else None,
                method=method,
                headers={"Accept": "application/json", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                    text = response.read()
                    return json.loads(text) if text.strip() else {}
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    raise FileNotFoundError(path) from None
                if exc.code in (307, 503):  # a standby ResourceManager: try the next
                    problems.append(f"{url}: standby ({exc.code})")
                    continue
                raise ClusterUnavailable(
                    f"YARN's ResourceManager {url} refused {method} {path} ({exc.code}): {_message(exc)}"
                ) from None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                problems.append(f"{url}: {getattr(exc, 'reason', exc)}")
        raise ClusterUnavailable(
            f"no ResourceManager answered {method} {path} ({'; '.join(problems)}): check that YARN runs and that "
            "HADOOP_CONF_DIR names it (yarn.resourcemanager.webapp.address in yarn-site.xml)"
        )


def _message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["RemoteException"]["message"])
    except (ValueError, KeyError, TypeError):
        return exc.reason


def application_report(app_id: str) -> AppReport | None:
    """The ResourceManager's record of an application, asked at most every REPORT_TTL seconds per application;
    None when YARN does not know it. ClusterUnavailable when no ResourceManager answers (also remembered for
    REPORT_TTL: a wait that polls does not wait out a timeout on every round)."""
    now = time.monotonic()
    cached = _recent.get(app_id)
    if cached is None or now - cached[0] >= REPORT_TTL:
        try:
            answer: AppReport | ClusterUnavailable | None = resource_manager().application(app_id)
        except ClusterUnavailable as exc:
            answer = exc
        cached = _recent[app_id] = (now, answer)
    if isinstance(cached[1], ClusterUnavailable):
        raise cached[1]
    return cached[1]


def resource_manager() -> ResourceManager:
    """The ResourceManager of this process's Hadoop configuration."""
    conf = hadoop_conf.load()
    conf.check_supported("YARN's ResourceManager")
    return ResourceManager(conf.resource_manager_urls(), conf.user)
