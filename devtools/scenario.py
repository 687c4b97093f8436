"""The whole lifecycle of a streaming job, driven through Airflow's DAGs (`dag.test()`: real tasks, real
deferrable triggers, real spark-submit drivers, the snapshot store on the embedded S3 server). Shared by
the demo (`make demo`, which prints it) and the end-to-end test (which asserts it).

    deploy v1 -> savepoint (pinned, labelled) -> retention -> upgrade to v2 (passes) -> upgrade to v3
    (blocked by the pre-flight: v2 keeps running) -> [upgrade to `poisoned`: it commits batches to the
    sink, then fails; the health gate fails and the rollback rewinds the sink and puts v2 back from the
    same savepoint] -> stop-with-savepoint -> exactly-once check

Events are fed continuously while the DAGs run (the health gate waits for new batches), then flushed,
so the final output can be compared with every event fed."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from airflow_plugin.core.context import JobContext, Settings
from airflow_plugin.core.jobs.deployments import Deployment, Deployments, DeploymentStatus, State, observed_state
from airflow_plugin.core.jobs.spec import JOBS_ENV
from airflow_plugin.core.sinks.file import QUARANTINE
from airflow_plugin.core.snapshots.manifest import Manifest
from airflow_plugin.core.snapshots.verify import verify_snapshot
from devtools.dag_runs import DagRunResult, run_dag
from devtools.windowed import Feeder, output_complete, processed, wait_for, write_jobs_file
from spark_jobs.jobs.windowed.output import read_output, summarize

JOB = "windowed"


def one_line(text: str, limit: int = 200) -> str:
    """The first line of a message, shortened: Spark's errors go on for pages."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Outcome(StrEnum):
    """What an upgrade is expected to end in."""

    UPGRADED = "upgraded"
    BLOCKED = "blocked by the pre-flight"
    ROLLED_BACK = "rolled back"


@dataclass
class Check:
    text: str
    ok: bool


class BackgroundFeeder:
    """Feeds a round of events every `interval` seconds on a thread, until stopped. While `poisoning`, it
    writes one poison event as soon as its condition holds, and then feeds nothing more until the block
    ends (so the poisoned version reaches the poison within a few batches)."""

    def __init__(self, feeder: Feeder, interval: float = 1.5) -> None:
        self.feeder, self.interval = feeder, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self._poison_when: Callable[[], bool] | None = None
        self._poisoned = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            condition = self._poison_when
            if condition is None:
                self.feeder.round()
            elif not self._poisoned.is_set():
                if condition():
                    self.feeder.poison()
                    self._poisoned.set()
                else:
                    self.feeder.round()

    @contextmanager
    def poisoning(self, condition: Callable[[], bool]) -> Iterator[threading.Event]:
        """Poison once `condition()` holds; yields the event that is set when it was written."""
        self._poisoned.clear()
        self._poison_when = condition
        try:
            yield self._poisoned
        finally:
            self._poison_when = None

    def __enter__(self) -> BackgroundFeeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Lifecycle:
    work: Path
    store_uri: str
    say: Callable[[str], None] = print
    checks: list[Check] = field(default_factory=list)
    runs: list[DagRunResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.jobs_file = write_jobs_file(self.work, self.store_uri, job=JOB)
        os.environ[JOBS_ENV] = str(self.jobs_file)  # the DAGs read the same jobs file
        self.job: JobContext = Settings(jobs_file=str(self.jobs_file)).resolve().job(JOB)
        self.store = self.job.store
        self.feeder = Feeder(self.work / "input")

    # -- observations
    @property
    def failures(self) -> list[str]:
        return [c.text for c in self.checks if not c.ok]

    def check(self, ok: bool, text: str) -> bool:
        self.checks.append(Check(text, bool(ok)))
        self.say(f"   {'PASS' if ok else 'FAIL'} {text}")
        return bool(ok)

    def deployments(self) -> list[Deployment]:
        return Deployments(self.store.storage).list(JOB)

    def state(self, deployment_id: str) -> State:
        records = Deployments(self.store.storage)
        return observed_state(records.get(JOB, deployment_id), records.status(JOB, deployment_id))

    def status(self, deployment_id: str) -> DeploymentStatus | None:
        return Deployments(self.store.storage).status(JOB, deployment_id)

    def running(self) -> list[Deployment]:
        return [d for d in self.deployments() if self.state(d.id) is State.RUNNING]

    def _run(self, dag_id: str, conf: dict[str, Any]) -> DagRunResult:
        result = run_dag(dag_id, conf)
        self.runs.append(result)
        tasks = ", ".join(f"{task}={state}" for task, state in result.tasks.items())
        self.say(f"   {dag_id}: {result.state} in {result.seconds:.1f}s ({tasks})")
        return result

    # -- the steps
    def deploy(self, version: str = "v1") -> Deployment:
        result = self._run("savepoints_deploy", {"job": JOB, "version": version, "restore": "none", "min_batches": 2})
        self.check(result.succeeded, f"deploy DAG: {version} deployed and healthy")
        deployed = result.value("deploy")
        self.check(self.state(deployed["deployment"]) is State.RUNNING, f"deployment {deployed['deployment']} RUNNING")
        return Deployments(self.store.storage).get(JOB, deployed["deployment"])

    def savepoint(self, *, label: str = "reason=demo", pin: bool = True) -> Manifest:
        conf = {"job": JOB, "stop": False, "pin": pin, "label": label}
        result = self._run("savepoints_savepoint", conf)
        self.check(result.succeeded, "savepoint DAG: live savepoint taken while the job runs")
        manifest = self.store.get(JOB, result.value("savepoint")["id"])
        key, _, value = label.partition("=")
        self.check(
            manifest.pinned == pin and manifest.labels.get(key) == value,
            f"savepoint {manifest.id} at batch {manifest.batch_id}: pinned, labelled {label}",
        )
        self.check(verify_snapshot(self.store, JOB, manifest.id).ok, f"savepoint {manifest.id} verifies")
        self.check(bool(self.running()), "the job kept running")
        return manifest

    def retention(self) -> DagRunResult:
        result = self._run("savepoints_retention", {"dry_run": False})
        self.check(result.succeeded, "retention DAG: retained checkpoint, prune and garbage collection")
        taken = [o for o in result.value("retention")["checkpoints"] if o.get("snapshot")]
        self.check(
            len(taken) == 1,
            "the running deployment's state is retained: "
            + ", ".join(
                f"{o['snapshot']} at batch {o['batch_id']}" + (" (already held)" if o["skipped"] else "") for o in taken
            ),
        )
        return result

    def upgrade(self, version: str, expect: Outcome, feeding: BackgroundFeeder | None = None) -> DagRunResult:
        before = self.running()
        if expect is Outcome.ROLLED_BACK and feeding is not None:  # poisoned after 2 batches of its own
            with feeding.poisoning(lambda: self._committed_since_restore(version) >= 2) as poisoned:
                result = self._run("savepoints_upgrade", {"job": JOB, "version": version, "min_batches": 10})
            self.check(poisoned.is_set(), f"{version} committed 2 batches to the sink, then read a poison event")
        else:
            result = self._run("savepoints_upgrade", {"job": JOB, "version": version, "min_batches": 3})
        after = self.running()
        old = before[0].version if before else "-"
        if expect is Outcome.BLOCKED:
            report = result.pushed.get("preflight", {}).get("report") or {}
            self.check(
                not result.succeeded and result.tasks.get("preflight") == "failed" and bool(report),
                f"upgrade DAG to {version}: blocked by the pre-flight on {report.get('id', '?')}",
            )
            self.say(f"   the pre-flight's reason: {one_line(report.get('reason', 'none recorded'))}")
            self.check(result.tasks.get("stop_old") not in ("success", "failed", "running"), "nothing was stopped")
            self.check([d.id for d in after] == [d.id for d in before], f"the running version {old} keeps running")
            return result
        stop_savepoint = result.value("stop_old")["snapshot"]["id"]
        if expect is Outcome.ROLLED_BACK:
            self.check(
                not result.succeeded and result.tasks.get("health_gate") == "failed",
                f"upgrade DAG to {version}: pre-flight passed, the health gate failed",
            )
            rolled = result.value("rollback") if result.tasks.get("rollback") == "success" else {}
            self.check(
                rolled.get("version") == old and rolled.get("restored_from") == stop_savepoint,
                f"rollback: {old} redeployed from the same savepoint {stop_savepoint}",
            )
            self.check([d.version for d in after] == [old], "the old version runs again")
            rewinds = [json.loads(p.read_text()) for p in (self.work / "output").glob(f"{QUARANTINE}*/rewind.json")]
            self.check(
                len(rewinds) == 1 and rewinds[0]["state"] == "done" and rewinds[0]["data"],
                f"the sink was rewound: {len(rewinds[0]['data']) if rewinds else 0} data files of {version} moved "
                f"into {QUARANTINE} and written again by {old}",
            )
            return result
        self.check(result.succeeded, f"upgrade DAG to {version}: savepoint, pre-flight, cutover, healthy")
        self.check(
            [d.version for d in after] == [version] and result.value("deploy_new")["restored_from"] == stop_savepoint,
            f"{version} runs, restored from the stop-with-savepoint {stop_savepoint}",
        )
        return result

    def _committed_since_restore(self, version: str) -> int:
        """Batches the newest deployment of `version` committed after the one it was restored at."""
        deployments = [d for d in self.deployments() if d.version == version]
        if not deployments:
            return 0
        newest = deployments[-1]
        status = Deployments(self.store.storage).status(JOB, newest.id)
        if status is None or status.last_batch_id is None or newest.restored_batch_id is None:
            return 0
        return status.last_batch_id - newest.restored_batch_id

    def finish(self) -> Manifest:
        """Flush, let the job process everything, stop it with a savepoint, check the output."""
        self.feeder.flush()
        current = self.running()[-1]
        wait_for(lambda: processed(current.checkpoint, self.feeder.rounds), "the job to process every file", 240)
        wait_for(lambda: output_complete(self.work / "output", self.feeder.events), "the last windows", 120)
        result = self._run("savepoints_savepoint", {"job": JOB, "stop": True, "pin": False, "label": "reason=final"})
        self.check(result.succeeded and not self.running(), "savepoint DAG with stop: stopped with a savepoint")
        summary = summarize(read_output(self.work / "output"))
        self.check(
            summary.events == self.feeder.events and not summary.duplicates,
            f"exactly once: {self.feeder.events} events fed, {summary.events} counted, "
            f"{len(summary.duplicates)} windows emitted twice",
        )
        self.check(
            "poisoned" not in summary.versions,
            f"the live output holds no row of a rolled-back version (rows per version: {summary.versions})",
        )
        return self.store.get(JOB, result.value("savepoint")["id"])

    def run(self, *, rollback: bool = False) -> None:
        self.say("deploy v1 (deploy DAG), feeding events")
        with BackgroundFeeder(self.feeder) as feeding:
            self.deploy("v1")
            self.say("savepoint (savepoint DAG, as the UI form would trigger it)")
            self.savepoint()
            self.say("retention (retention DAG)")
            self.retention()
            self.say("upgrade to v2 (restore-and-redeploy DAG)")
            self.upgrade("v2", Outcome.UPGRADED)
            self.say("upgrade to v3: state-incompatible")
            self.upgrade("v3", Outcome.BLOCKED)
            if rollback:
                self.say("upgrade to poisoned: it commits batches to the sink, then fails")
                self.upgrade("poisoned", Outcome.ROLLED_BACK, feeding)
        self.say("stop feeding; stop with a savepoint (savepoint DAG); exactly-once check")
        self.finish()
