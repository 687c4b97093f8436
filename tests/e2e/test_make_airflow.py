"""`make airflow`, the README's way in for people who want the UI, run as a user runs it (`make airflow`
through make and uv, i.e. `airflow standalone`) from a user's shell with no Airflow settings: log in with the
password standalone generated, see the DAGs with no import errors and the plugin's page behind authentication,
run the reconcile DAG, which deploys a declared job (a stand-in driver, no Spark), and see a change to the jobs
file run it again by itself (the file's watcher in standalone's triggerer), which stops the job as the file now
says; run the retention DAG through standalone's own scheduler and executor and read its task log; check that
nothing listens beyond 127.0.0.1, have a real Prometheus (Debian's) scrape the plugin's /savepoints/metrics
with a bearer token as docs/operations.md configures it and check its answers against the store (the store's
figures as of the retention run's prune, which says when it measured), and stop it
with one Ctrl-C (SIGINT to the terminal's foreground process group: make, uv and Python all get it) that ends
everything gracefully and says which deployment still runs and how to stop it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.observe import state_of
from airflow_plugin.core.reconcile import record as records
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import LocalStorage, open_storage
from airflow_plugin.triggers.jobs_file import FINGERPRINT
from devtools import processes
from devtools.airflow_env import REPO
from devtools.airflow_ui import STOP_GRACE
from devtools.ports import free_port
from devtools.windowed import wait_for
from tests.airflow.test_dags import DAG_IDS
from tests.support.jobs import POLITE_JOB, kill_every_deployment
from tests.support.sockets import listening, not_loopback
from tests.support.synthetic import write_checkpoint
from tests.support.ui_support import HTTP_WAIT_S

pytestmark = [pytest.mark.slow]


class Standalone:
    def __init__(self, tmp_path: Path, jobs: Path | None = None) -> None:
        self.home, self.port = tmp_path / "airflow-home", free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "standalone.log"
        # a user's shell: none of this test session's Airflow settings
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SAVEPOINTS"))}
        self.env["SAVEPOINTS_STORE"] = str(tmp_path / "store")  # not the repository's .runs/store
        if jobs is not None:  # a user's jobs file, for the DAGs and the page (else the repository's jobs.toml)
            self.env["SAVEPOINTS_JOBS"] = str(jobs)
        self.token = ""

    def __enter__(self) -> Standalone:
        command = ["make", "airflow", f"AIRFLOW_PORT={self.port}", f"AIRFLOW_DIR={self.home}"]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.interrupt()

    def interrupt(self) -> int:
        """Ctrl-C in the terminal: SIGINT to the whole foreground process group. Returns the exit code. A component
        that outlives devtools/airflow_ui.py's grace is killed by it, named: the test says which, with its stacks
        (Airflow's own shutdown, beside a busy CI worker, has once kept standalone waiting)."""
        os.killpg(self.process.pid, signal.SIGINT)
        patience = STOP_GRACE - 10  # the stacks are taken before the grace kills what they would show
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout=patience)
        stuck = self.stuck_report()
        warnings.warn(f"standalone had not stopped {patience:.0f} s after the Ctrl-C:\n{stuck}", stacklevel=2)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stuck = self.stuck_report()
            os.killpg(self.process.pid, signal.SIGINT)  # the second Ctrl-C kills it
            self.process.wait(timeout=30)
            raise AssertionError(
                f"airflow standalone ignored Ctrl-C:\n{self.log_tail()}\nstill running:\n{stuck}"
            ) from None

    def stuck_report(self) -> str:
        """What still runs, each process with its state and, where py-spy is installed, its Python stacks."""
        spy = shutil.which("py-spy")
        lines = []
        for pid, command in sorted(self.processes().items()):
            if (fields := processes.stat_fields(pid)) is None:
                continue
            lines.append(f"{pid} [{fields[processes.STATE]}] {command[:300]}")
            if spy and "python" in os.path.basename(os.path.realpath(f"/proc/{pid}/exe")):
                dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
                lines.append((dump.stdout or dump.stderr)[-3000:])
        return "\n".join(lines)

    def processes(self) -> dict[int, str]:
        """Processes of this `make airflow` (standalone's components and their workers, the broker): pid ->
        command. By descent from make, and by AIRFLOW_HOME in their environment (which finds orphans; a
        process that sets its title, as the API server does, may have overwritten its environment's copy)."""
        marker = f"AIRFLOW_HOME={self.home}".encode()
        parents, marked = {}, set()
        for pid in processes.pids():
            if (fields := processes.stat_fields(pid)) is None:
                continue
            parents[pid] = int(fields[processes.PARENT])
            try:
                if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    marked.add(pid)
            except OSError:  # gone meanwhile, or not ours to read
                continue
        family = {self.process.pid}
        while grown := {pid for pid, parent in parents.items() if parent in family} - family:
            family |= grown
        found = {pid: processes.command_line(pid) for pid in (marked | family) - {self.process.pid}}
        return {pid: command for pid, command in found.items() if command}

    def leftover_processes(self) -> list[str]:
        return [f"{pid}: {command}" for pid, command in self.processes().items()]

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float) -> None:
        try:
            wait_for(condition, what, timeout)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; airflow standalone said:\n{self.log_tail()}") from None

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"airflow standalone exited with {self.process.returncode}:\n{self.log_tail()}")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=HTTP_WAIT_S, **kwargs)

    def patch(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.patch(
            f"{self.url}{path}", json=body, headers={"Authorization": f"Bearer {self.token}"}, timeout=HTTP_WAIT_S
        )

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            f"{self.url}{path}", json=body, headers={"Authorization": f"Bearer {self.token}"}, timeout=HTTP_WAIT_S
        )

    def run_dag(self, dag_id: str) -> tuple[str, dict[tuple[str, int], str]]:
        """Trigger a run of `dag_id` through the API and wait for the scheduler to finish it: its path and each task's
        state (a successful run, or the test fails with the states)."""
        created = self.post(f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})
        assert created.status_code == 200, created.text
        return self._finished(f"/api/v2/dags/{dag_id}/dagRuns/{created.json()['dag_run_id']}")

    def finished_run(self, dag_id: str, run_type: str) -> tuple[str, dict[tuple[str, int], str]]:
        """Wait for the scheduler to make a run of `dag_id` of `run_type` (its own, not the test's) and finish it."""
        runs = f"/api/v2/dags/{dag_id}/dagRuns"
        made: list[str] = []

        def started() -> bool:
            self.alive()
            with contextlib.suppress(httpx.HTTPError):
                made.extend(r["dag_run_id"] for r in self.get(runs, params={"run_type": run_type}).json()["dag_runs"])
            return bool(made)

        self.wait_for(started, f"a {run_type} run of {dag_id}", timeout=180)
        assert self.get(f"{runs}/{made[0]}").json()["run_type"] == run_type, made
        return self._finished(f"{runs}/{made[0]}")

    def _finished(self, run_path: str) -> tuple[str, dict[tuple[str, int], str]]:
        def finished() -> bool:
            self.alive()
            try:
                return self.get(run_path).json()["state"] in ("success", "failed")
            except httpx.HTTPError:  # an API server slow to answer on a busy machine: ask again
                return False

        self.wait_for(finished, f"the run {run_path}", timeout=240)
        tasks = self.get(f"{run_path}/taskInstances").json()["task_instances"]
        states = {(t["task_id"], t["map_index"]): t["state"] for t in tasks}
        assert self.get(run_path).json()["state"] == "success", states
        assert states and set(states.values()) == {"success"}, states
        return run_path, states

    def log_in(self) -> None:
        password_file = self.home / "simple_auth_manager_passwords.json.generated"
        self.wait_for(password_file.exists, "the admin password standalone generates", timeout=120)
        password = json.loads(password_file.read_text())["admin"]
        response = httpx.post(
            f"{self.url}/auth/token", json={"username": "admin", "password": password}, timeout=HTTP_WAIT_S
        )
        assert response.status_code == 201, response.text
        self.token = response.json()["access_token"]


def _answers(standalone: Standalone, path: str) -> bool:
    standalone.alive()
    try:
        return standalone.get(path).status_code == 200
    except httpx.HTTPError:
        return False


class Prometheus:
    """Debian's prometheus on 127.0.0.1, scraping the plugin every second with the scrape config of
    docs/operations.md (a bearer token from a file); stopped by its pid."""

    def __init__(self, tmp_path: Path, target: str, token: str) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is missing: `make prometheus` installs Debian's package", pytrace=False)
        tmp_path.mkdir(parents=True, exist_ok=True)
        (tmp_path / "token").write_text(token)
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "savepoints",
                    "metrics_path": "/savepoints/metrics",
                    "honor_labels": True,  # the metrics' own `job` label (the streaming job) is kept as is
                    "authorization": {"credentials_file": str(tmp_path / "token")},
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.url = f"http://127.0.0.1:{free_port()}"
        command = [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
        ]
        self.log = tmp_path / "prometheus.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def query(self, expression: str) -> dict[str, float]:
        """Each series' labels (as sorted text) -> value, of an instant query."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expression}, timeout=HTTP_WAIT_S).json()
        assert answer["status"] == "success", answer
        return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in answer["data"]["result"]}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _heartbeat(store: str, deployment: Deployment, stop: threading.Event) -> None:
    """A running deployment as its runtime reports it (no Spark: a heartbeat every half second)."""
    records = Deployments(open_storage(store))
    while not stop.is_set():
        status = DeploymentStatus(State.RUNNING, time.time(), last_batch_id=7, rows_per_second=3.5, kafka_lag=12)
        records.write_status(deployment.job, deployment.id, status)
        stop.wait(0.5)


def _watch_the_jobs_file(airflow: Standalone) -> None:
    """Unpause the reconcile DAG (Airflow watches the assets of unpaused DAGs only), have its file parsed again
    (which registers the watcher), and wait until the triggerer's watcher has kept its first look at the jobs file."""
    dag = "/api/v2/dags/savepoints_reconcile"
    assert airflow.patch(dag, {"is_paused": False}).status_code == 200
    reparse = httpx.put(
        f"{airflow.url}/api/v2/parseDagFile/{airflow.get(dag).json()['file_token']}",
        headers={"Authorization": f"Bearer {airflow.token}"},
        timeout=HTTP_WAIT_S,
    )
    assert reparse.status_code in (200, 201), reparse.text
    database = airflow.home / "airflow.db"

    def kept() -> bool:
        airflow.alive()
        query = "SELECT 1 FROM asset_state_store WHERE key = ?"
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)
        with contextlib.closing(connection) as db, contextlib.suppress(sqlite3.OperationalError):  # locked: ask again
            return db.execute(query, (FINGERPRINT,)).fetchone() is not None
        return False

    airflow.wait_for(kept, "the jobs file's watcher to take its first look (the asset state store)", timeout=180)


def _declared_jobs_file(tmp_path: Path) -> Path:
    """The repository's jobs with one more, declared: `polite` (a stand-in driver, no Spark) should run v1."""
    (tmp_path / "polite.py").write_text(POLITE_JOB)
    jobs = tmp_path / "jobs.toml"
    declared = f"""
[jobs.polite]
versions.v1 = {{ application = "{tmp_path / "polite.py"}" }}
desired = {{ version = "v1" }}
"""
    jobs.write_text((REPO / "jobs.toml").read_text() + declared)
    for linked in ("spark_jobs", "devtools"):  # the example jobs' paths are relative to the jobs file
        (tmp_path / linked).symlink_to(REPO / linked)
    return jobs


def test_make_airflow_serves_the_dags_and_the_page_and_runs_a_dag(tmp_path: Path) -> None:
    store_uri = str(tmp_path / "store")
    jobs_file = _declared_jobs_file(tmp_path)
    checkpoint = write_checkpoint(tmp_path / "checkpoint", batches=5)
    savepoint = create_snapshot(
        SnapshotStore(open_storage(store_uri)), LocalStorage(checkpoint), SnapshotRequest("windowed_counts")
    )
    with Standalone(tmp_path, jobs_file) as airflow:

        def healthy() -> bool:
            if not _answers(airflow, "/api/v2/monitor/health"):
                return False
            health = airflow.get("/api/v2/monitor/health").json()
            return all(health.get(c, {}).get("status") == "healthy" for c in ("metadatabase", "scheduler"))

        airflow.wait_for(healthy, "airflow standalone's API server and a healthy scheduler", timeout=240)
        assert httpx.get(f"{airflow.url}/api/v2/dags", timeout=HTTP_WAIT_S).status_code == 401
        assert (
            httpx.get(f"{airflow.url}/savepoints/api/jobs", timeout=HTTP_WAIT_S).status_code == 401
        )  # not open by default
        airflow.log_in()

        def dags_parsed() -> bool:
            airflow.alive()
            listed = airflow.get("/api/v2/dags", params={"tags": "savepoints"}).json()
            return {dag["dag_id"] for dag in listed["dags"]} >= DAG_IDS

        airflow.wait_for(dags_parsed, f"the DAGs {sorted(DAG_IDS)} parsed by standalone's DAG processor", timeout=180)
        errors = airflow.get("/api/v2/importErrors").json()
        assert errors["total_entries"] == 0, errors

        jobs = airflow.get("/savepoints/api/jobs")
        assert jobs.status_code == 200, jobs.text
        assert "windowed_counts" in jobs.text  # the jobs of jobs.toml, on the store given by SAVEPOINTS_STORE

        # the reconcile loop through the scheduler (issue 46): the declared job is deployed by `savepoints apply`
        polite = Settings(jobs_file=str(jobs_file), store=store_uri).resolve().job("polite")
        try:
            _, states = airflow.run_dag("savepoints_reconcile")
            assert set(states) == {("apply", 0)}, states  # a mapped task per declared job: polite's
            [deployed] = polite.deployments.list("polite")
            assert deployed.version == "v1" and state_of(polite, deployed) is State.RUNNING
            reconciled = records.read(polite.store.storage, "polite")
            assert reconciled.last_step is not None and "DEPLOY" in reconciled.last_step, reconciled

            # a change to the jobs file runs the loop at once: the file's watcher in standalone's triggerer
            _watch_the_jobs_file(airflow)
            jobs_file.write_text(
                jobs_file.read_text().replace('{ version = "v1" }', '{ version = "v1", state = "stopped" }')
            )
            _, states = airflow.finished_run("savepoints_reconcile", run_type="asset_triggered")
            assert set(states) == {("apply", 0)}, states
            assert state_of(polite, polite.deployments.get("polite", deployed.id)) is State.STOPPED
            reconciled = records.read(polite.store.storage, "polite")
            assert reconciled.last_step is not None and "STOP" in reconciled.last_step, reconciled
        finally:
            kill_every_deployment(polite)

        # a DAG run end to end: standalone's scheduler, executor and worker through the execution API. It runs after
        # the reconcile runs, whose stop with a savepoint wrote contents last: each prune measures the store for the
        # metrics (retention/usage.py), so the store's figures Prometheus reads below are as of this run
        measured_after = time.time()
        run_path, states = airflow.run_dag("savepoints_retention")
        # the task's log, as the UI shows it: read from its file (there are no task log servers)
        logs = [
            airflow.get(f"{run_path}/taskInstances/retention/logs/1", params={"map_index": index})
            for task_id, index in states
            if task_id == "retention"
        ]
        assert logs and all(log.status_code == 200 for log in logs), [log.text[:500] for log in logs]
        assert any("retention of windowed_counts" in log.text for log in logs), [log.text[:2000] for log in logs]

        # nothing listens beyond this machine, and nothing on Airflow's fixed log server ports
        addresses = listening(list(airflow.processes()))
        assert ("127.0.0.1", airflow.port) in addresses, addresses
        assert not_loopback(addresses) == set(), addresses
        assert not {port for _, port in addresses} & {8793, 8794}, addresses

        # a deployment runs (a heartbeat, no Spark); a real Prometheus scrapes the plugin and answers from the store
        running = Deployment("dp-20261125T000000000Z-0001", "windowed_counts", "v1", str(checkpoint))
        Deployments(open_storage(store_uri)).put(running)
        stop_heartbeat = threading.Event()
        heartbeat = threading.Thread(target=_heartbeat, args=(store_uri, running, stop_heartbeat), daemon=True)
        heartbeat.start()
        prometheus = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{airflow.port}", airflow.token)
        try:

            def scraped() -> bool:
                airflow.alive()
                try:
                    return bool(prometheus.query("savepoints_deployment_last_committed_batch"))
                except httpx.HTTPError:
                    return False

            airflow.wait_for(scraped, f"Prometheus to scrape the plugin ({prometheus.log})", timeout=60)
            assert prometheus.query('up{job="savepoints"}') == {
                json.dumps({"__name__": "up", "instance": f"127.0.0.1:{airflow.port}", "job": "savepoints"}): 1.0
            }
            batch = prometheus.query(
                f'savepoints_deployment_last_committed_batch{{job="windowed_counts",deployment="{running.id}"}}'
            )
            assert list(batch.values()) == [7.0], batch
            state = prometheus.query(f'savepoints_deployment_state{{deployment="{running.id}"}} == 1')
            assert [json.loads(k)["state"] for k in state] == ["RUNNING"], state
            last = prometheus.query('savepoints_last_snapshot_batch{job="windowed_counts",kind="savepoint"}')
            assert list(last.values()) == [float(savepoint.batch_id)], last
            # the store's figures are as of the last prune, and say when that was: the retention run above, after
            # the last write of contents (a figure measured earlier would miss what was written since: ci, issue 53)
            measured = prometheus.query("savepoints_store_usage_timestamp_seconds")
            [measured_at] = measured.values()
            assert measured_after <= measured_at <= time.time(), (measured_after, measured)
            storage = open_storage(store_uri)
            stored = [*storage.list("blobs/"), *storage.list("packs/")]
            objects = prometheus.query("savepoints_store_objects")
            assert list(objects.values()) == [float(len(stored))], (objects, stored)
        finally:
            prometheus.stop()

        returncode = airflow.interrupt()
        stop_heartbeat.set()
        # make, itself interrupted, waits for its recipe and then ends by the same SIGINT
        assert returncode in (0, -signal.SIGINT), (returncode, airflow.log_tail())
    log_text = airflow.log_tail()
    assert "standalone | Complete" in log_text, log_text
    assert "killing airflow standalone" not in log_text, log_text  # one Ctrl-C, handled once
    # the deployment outlives Airflow, and the shutdown says so and how to stop it (devtools/airflow_ui.py)
    assert (
        f"still running: windowed_counts's deployment {running.id} (v1, RUNNING); its driver is not Airflow's and "
        f"runs on: stop it with `SAVEPOINTS_STORE={store_uri} savepoints stop windowed_counts --jobs {jobs_file}`"
    ) in log_text, log_text
    assert airflow.leftover_processes() == []


def test_at_shutdown_a_job_reading_the_broker_is_stopped_and_the_others_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make airflow`'s shutdown report (devtools/airflow_ui.py) without Airflow: a deployment of a job that reads
    the broker it is about to stop is stopped through its control channel (a stand-in runtime honours it); one
    of another job is named, with the command that stops it."""
    from devtools.airflow_ui import still_running
    from spark_jobs.runtime.control import ControlChannel
    from tests.support.jobs import write_jobs

    jobs = write_jobs(tmp_path, extra='[jobs.other]\nversions.v1 = { application = "job.py" }')
    monkeypatch.delenv("SAVEPOINTS_STORE", raising=False)
    store = str(tmp_path / "store")
    records = Deployments(open_storage(store))
    brokered = Deployment("dp-20261125T000000000Z-0001", "orders", "v1", str(tmp_path / "c1"))
    other = Deployment("dp-20261125T000000000Z-0002", "other", "v1", str(tmp_path / "c2"))
    for deployment in (brokered, other):
        records.put(deployment)
    done = threading.Event()

    def runtime() -> None:  # the brokered one honours a stop at its next "batch"; the other only beats
        control = ControlChannel(records, "orders", brokered.id)
        stopped: list[str] = []
        while not done.is_set():
            if not stopped and (request := control.next_stop()) is not None:
                stopped.append(request.id)
            state = State.STOPPED if stopped else State.RUNNING
            records.write_status("orders", brokered.id, DeploymentStatus(state, time.time(), handled_requests=stopped))
            records.write_status("other", other.id, DeploymentStatus(State.RUNNING, time.time()))
            done.wait(0.2)

    beating = threading.Thread(target=runtime, daemon=True)
    beating.start()
    try:
        time.sleep(0.5)
        lines = still_running(str(jobs), {"orders"})
    finally:
        done.set()
        beating.join()
    assert lines == [
        f"stopped orders's deployment {brokered.id}: it reads the Kafka broker that stops now "
        "(`savepoints deploy --restore latest-state` continues it)",
        f"still running: other's deployment {other.id} (v1, RUNNING); its driver is not Airflow's and runs on: "
        f"stop it with `savepoints stop other --jobs {jobs}`",
    ]


STUBBORN_STANDALONE = """
import signal, subprocess, sys
# a component that ignores the SIGTERM standalone sends it at shutdown
component = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
     "time.sleep(600)"],
    stdout=subprocess.PIPE,
)
component.stdout.readline()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # held from here: a Ctrl-C right after "ready" waits
print("ready", flush=True)
signal.sigwait({signal.SIGINT})
component.terminate()
component.wait()
print("complete", flush=True)
"""


def test_a_component_that_ignores_its_sigterm_is_named_and_killed_after_the_grace() -> None:
    """`make airflow`'s Ctrl-C (devtools/airflow_ui.py) when one of standalone's components does not stop: a
    stand-in standalone that, like the real one, terminates its component and waits for it; the component ignores
    SIGTERM. After the grace (1 s here) the component is named and killed, and the stand-in ends on its own."""
    wrapper = (
        "import sys, devtools.airflow_ui as ui; ui.STOP_GRACE = 1.0; "
        f"sys.exit(ui.run_until_interrupted([sys.executable, '-c', {STUBBORN_STANDALONE!r}]))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", wrapper], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    lines = output.splitlines()
    assert lines[0] == "stopping airflow standalone (Ctrl-C again to kill it)", output
    killed = r".*python.* -c import signal, time;.* \(pid \d+\) did not stop 1 s after the Ctrl-C: killing it"
    assert re.fullmatch(killed, lines[1]), output
    assert lines[2:] == ["complete"], output
