"""The whole lifecycle of a streaming job that reads Kafka, driven through Airflow's DAGs (`dag.test()`: real
tasks, real deferrable triggers, real spark-submit drivers, the snapshot store on the embedded S3 server,
a real Kafka broker). Shared by the demo (`make demo`, which prints it) and the end-to-end test (which
asserts it). The job is the windowed example reading a topic (dedup and windowed counts, RocksDB), writing a
file sink beside its local checkpoints, or with a `lake` (an S3 bucket, `s3a://...`) the production stack:
checkpoints on S3 through S3A and a Delta table on S3 as the sink.

    deploy v1 -> savepoint (pinned, labelled; it records the Kafka offsets) -> retention -> upgrade to v2
    (the pre-flight picks the mode: blue/green on Delta; the health gate waits for the Kafka lag to fall) ->
    [upgrade to `poisoned`: it fails before its cutover, the upgrade aborts, v2 never stopped; again, failing
    after its cutover: the rollback rewinds the sink and puts v2 back from the same savepoint] -> upgrade to
    v3 (a new grouping key: the state cannot be taken over, v3 replays, beside v2, from where the state it
    needs began) -> upgrade to `by_country_broken` (a migration function that returns a key twice:
    refused before anything starts, v3 keeps running) -> upgrade to by_country (per country: its state made
    from v3's by the version's migration function, checked on a throwaway run) -> [SIGKILL of the driver
    mid-batch, redeployed from the latest state] -> Kafka retention deletes the records the running version
    read: a replay upgrade back to v2 is refused, naming what is gone -> stop-with-savepoint -> exactly-once
    check of every record produced, each window written by one version -> a fresh deploy (restore none) onto
    the sink the job wrote is refused (it would write every record again, or lose them) -> retention deletes
    the records the first savepoint would read next: a deploy from it is refused before anything starts, and
    the retention plan marks it with the records lost

Events are produced continuously while the DAGs run (the health gate waits for new batches), with a few
producer retries (records sent twice), then flushed, so the final output can be compared with every
distinct event produced."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from airflow_plugin.core.guards import source as source_guard
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deployments import Deployments, observed_state
from airflow_plugin.core.jobs.spec import JOBS_ENV
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import Manifest
from airflow_plugin.core.sinks import delta as delta_sink
from airflow_plugin.core.sinks import file as file_sink
from airflow_plugin.core.sinks.file import QUARANTINE
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
from airflow_plugin.core.upgrades.steps import iso_millis
from devtools.dag_runs import DagRunResult, run_dag
from devtools.feeding import BackgroundFeeder
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import (
    JOB,
    PARTITIONS,
    KafkaFeeder,
    began_at,
    commit_gaps,
    committed_offsets,
    processed,
    table_of,
    write_jobs_file,
)
from devtools.windowed import batches, wait_for
from spark_jobs.jobs.windowed.output import read_output, read_table, summarize

BESIDE = ("blue_green", "replay", "migrate")  # the modes that run the new version beside the old one


def one_line(text: str, limit: int = 200) -> str:
    """The first line of a message, shortened: Spark's errors go on for pages."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Outcome(StrEnum):
    """What an upgrade is expected to end in."""

    UPGRADED = "upgraded"
    BLOCKED = "blocked by the pre-flight"
    ABORTED = "aborted before the cutover"
    ROLLED_BACK = "rolled back"


def _committed(lifecycle: Lifecycle, upgrade: Upgrade) -> int:
    """Batches the upgrade's new deployment committed after the one it was restored at."""
    if not upgrade.new_deployment:
        return 0
    records = Deployments(lifecycle.store.storage)
    new = records.get(JOB, upgrade.new_deployment)
    status = records.status(JOB, new.id)
    if status is None or status.last_batch_id is None or new.restored_batch_id is None:
        return 0
    return status.last_batch_id - new.restored_batch_id


def _otherwise(record: Upgrade, as_expected: bool) -> str:
    """What a failed outcome check says beside what was expected: the phase the upgrade ended in, its error and
    its steps (the scenario's only record of why, in a CI log)."""
    if as_expected:
        return ""
    steps = "; ".join(f"{h['phase']}: {one_line(str(h.get('note') or ''), 200)}" for h in record.history)
    return f" [it ended {record.phase}: {one_line(str(record.error or '-'), 300)}; steps: {steps}]"


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass
class Check:
    text: str
    ok: bool


@dataclass
class Lifecycle:
    work: Path
    store_uri: str
    kafka: EmbeddedKafka
    lake: str | None = None  # s3a://bucket: checkpoints and a Delta sink there
    say: Callable[[str], None] = print
    checks: list[Check] = field(default_factory=list)
    runs: list[DagRunResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.topic = f"events-{uuid.uuid4().hex[:8]}"
        self.kafka.create_topic(self.topic, PARTITIONS)
        self.jobs_file = write_jobs_file(self.work, self.store_uri, self.kafka.bootstrap, self.topic, lake=self.lake)
        os.environ[JOBS_ENV] = str(self.jobs_file)  # the DAGs read the same jobs file
        self.job: JobContext = Settings(jobs_file=str(self.jobs_file)).resolve().job(JOB)
        self.store = self.job.store
        self.feeder = KafkaFeeder(self.kafka, self.topic)
        self.first_savepoint: Manifest | None = None

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

    def output(self) -> list[dict[str, Any]]:
        """The job's output as committed: the Delta table's newest version, or the file sink's log."""
        if self.lake:
            return read_table(self.job.open(table_of(self.lake)))
        return read_output(self.work / "output")

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
        [position] = [p for p in result.value("savepoint")["source_positions"] if p["kind"] == "kafka"]
        offsets = position["offset"].get(self.topic, {})
        self.check(
            len(offsets) == PARTITIONS,
            f"it records the Kafka offsets at batch {manifest.batch_id} (its XCom too): {self.topic} {offsets}",
        )
        self.first_savepoint = self.first_savepoint or manifest
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

    def upgrade(
        self,
        version: str,
        expect: Outcome,
        feeding: BackgroundFeeder | None = None,
        *,
        mode: str = "auto",
        poison: Callable[[Upgrade], bool] | None = None,
    ) -> Upgrade:
        """One run of the upgrade DAG (`mode`: the form's; auto, the pre-flight's choice), checked against what
        `expect` says. With `poison`, a poison event is produced once it holds for the upgrade's record: the
        `poisoned` version fails on it (before its cutover: an abort; after it: a rollback)."""
        self._read_past_poison()
        before, upgrades = self.running(), len(self.upgrades())
        conf = {"job": JOB, "version": version, "mode": mode, "min_batches": 3, "kafka_lag_must_fall": True}
        if poison is not None and feeding is not None:
            conf["min_batches"] = 10  # it must not pass its health gate before the poison reaches it
            with feeding.poisoning(lambda: bool(self.upgrades()[upgrades:]) and poison(self.upgrades()[-1])) as hit:
                result = self._run("savepoints_upgrade", conf)
            self.check(hit.is_set(), f"{version} read a poison event")
        else:
            result = self._run("savepoints_upgrade", conf)
        after, record = self.running(), self.upgrades()[-1]
        old = before[0] if before else None
        self.say(f"   upgrade {record.id}: mode {record.mode or '-'}, {record.phase}")
        if expect is Outcome.BLOCKED:
            reason = record.error or ((record.preflight or {}).get("reason")) or "none recorded"
            self.check(
                not result.succeeded and result.tasks.get("begin") == "failed" and record.phase is Phase.BLOCKED,
                f"upgrade DAG to {version}: blocked before anything started, on {record.savepoint}",
            )
            self.say(f"   why: {one_line(reason, 400)}")
            self.check(record.new_deployment is None, "nothing was started")
            self.check(
                [d.id for d in after] == [d.id for d in before],
                f"the running version {old.version if old else '-'} keeps running",
            )
            return record
        if expect is Outcome.ABORTED:
            green = Deployments(self.store.storage).get(JOB, str(record.new_deployment))
            aborted = not result.succeeded and record.phase is Phase.ABORTED and not record.cut_over
            self.check(
                aborted,
                f"upgrade DAG to {version} ({record.mode}): {green.id} failed before the cutover, the upgrade aborted"
                + _otherwise(record, aborted),
            )
            self.check(
                [d.id for d in after] == [d.id for d in before],
                f"the old deployment {old.id if old else '-'} never stopped",
            )
            written = summarize(self.output()).versions.get(version, 0)
            self.check(
                written == 0 and not self.job.open(str(record.staging)).exists(),
                f"the table holds nothing of {version} ({written} rows); its staging table is gone",
            )
            return record
        if expect is Outcome.ROLLED_BACK:
            rolled_back = not result.succeeded and record.phase is Phase.ROLLED_BACK and record.cut_over
            if not self.check(
                rolled_back,
                f"upgrade DAG to {version} ({record.mode}): it failed after the cutover, the upgrade rolled back"
                + _otherwise(record, rolled_back),
            ):
                return record  # nothing was rolled back: what follows would check what is not there
            redeployed = after[-1] if after else None
            self.check(
                redeployed is not None
                and old is not None
                and redeployed.version == old.version
                and redeployed.restored_from == record.rollback_savepoint,
                f"rollback: {old.version if old else '-'} redeployed from savepoint {record.rollback_savepoint}",
            )
            self._check_rewound(
                version,
                old.version if old else "-",
                str(record.rollback_savepoint),
                redeployed.id if redeployed else None,
            )
            return record
        done = result.succeeded and record.phase is Phase.DONE
        if not self.check(done, f"upgrade DAG to {version}: {record.mode}, healthy" + _otherwise(record, done)):
            return record
        new = Deployments(self.store.storage).get(JOB, str(record.new_deployment))
        self.check([d.id for d in after] == [new.id], f"{version} runs ({new.id}), the old version stopped")
        sources = (record.preflight or {}).get("sources") or {}
        self.check(
            sources.get("restorable") is True, f"the pre-flight checked the Kafka offsets: {sources.get('summary')}"
        )
        if record.mode in BESIDE:
            gap, usual = self.commit_gaps(record)
            started = {
                "blue_green": f"from the live savepoint {record.savepoint}"
                if new.restored_from == record.savepoint
                else None,
                "replay": f"with empty state, replaying {(record.replay or {}).get('records')} Kafka records from "
                f"{(record.replay or {}).get('note')}"
                if record.replay and new.restored_from is None
                else None,
                "migrate": f"with the state {(record.migration or {}).get('function')} made from {record.savepoint}"
                if (record.migration or {}).get("passed") and new.restored_from is None
                else None,
            }[str(record.mode)]
            self.check(
                started is not None and record.cutover_ms is not None,
                f"{version} started beside {old.version if old else '-'} {started}, took over at "
                f"{iso_millis(record.cutover_ms)}",
            )
            self.say(
                f"   the output never stopped: the longest time without a commit to the table during the "
                f"upgrade was {gap:.1f} s (before it: {usual:.1f} s)"
            )
        status = Deployments(self.store.storage).status(JOB, new.id)
        self.check(
            status is not None and status.kafka_lag is not None,
            f"its health gate saw the Kafka lag fall: {status.kafka_lag if status else '-'} at batch "
            f"{status.last_batch_id if status else '-'} (first batch {status.kafka_lag_first if status else '-'})",
        )
        return record

    def _read_past_poison(self) -> None:
        """Wait until the running version's latest batch began after the last poison event: the pre-flight runs
        the live savepoint's last batch again, so a `poisoned` version restored from one that holds the poison
        would be blocked there (rightly), not fail where the scenario means it to."""
        current, poisoned = self.running(), self.feeder.poisoned
        if current and poisoned:
            wait_for(
                lambda: all(began_at(current[-1].checkpoint).get(p, 0) >= end for p, end in poisoned.items()),
                f"{current[-1].id} to begin a batch after the poison event",
                300,
            )

    def upgrades(self) -> list[Upgrade]:
        return Upgrades(self.store.storage).list(JOB)

    def commit_gaps(self, upgrade: Upgrade) -> tuple[float, float]:
        """The longest time the Delta table went without a commit during the upgrade, and before it."""
        if not self.lake:
            return 0.0, 0.0
        table = self.job.open(table_of(self.lake))
        return commit_gaps(table, _seconds(upgrade.created_at), _seconds(upgrade.updated_at))

    def _check_rewound(self, version: str, old: str, savepoint: str, redeployed: str | None) -> None:
        """The rollback rewound the sink: the Delta table RESTOREd to the savepoint's version and the restored
        query under a new id, or the file sink's later output moved into its quarantine."""
        if self.lake:
            table = self.job.open(table_of(self.lake))
            taken = self.store.get(JOB, savepoint)
            [sink], query = taken.sinks, taken.query_id
            restores = delta_sink.restored_versions(table)
            restored = Deployments(self.store.storage).get(JOB, redeployed) if redeployed else None
            new_id = json.loads(self.job.open(restored.checkpoint).read("metadata"))["id"] if restored else None
            self.check(
                restores == [sink["version"]] and new_id not in (None, query),
                f"the Delta table was rewound: RESTORE to version {sink['version']} (the savepoint's), and {old} "
                f"writes the batches of {version} again under a new query id {new_id}",
            )
            return
        rewinds = [json.loads(p.read_text()) for p in (self.work / "output").glob(f"{QUARANTINE}*/rewind.json")]
        self.check(
            len(rewinds) == 1 and rewinds[0]["state"] == "done" and rewinds[0]["data"],
            f"the sink was rewound: {len(rewinds[0]['data']) if rewinds else 0} data files of {version} moved "
            f"into {QUARANTINE} and written again by {old}",
        )

    def crash(self) -> Deployment:
        """SIGKILL the running driver in the middle of a batch (offsets logged, no commit), then deploy the same
        version from the latest state: the live checkpoint is snapshotted with its pending batch, replayed."""
        victim = self.running()[-1]
        deadline, seen = time.monotonic() + 120, batches(victim.checkpoint, "offsets")[-1:]
        while time.monotonic() < deadline:
            # the moment a batch's offsets appear: its Spark job, then its write to the table, are still to come
            # (seconds here): the usual crash. One after the table's commit replays the same (the gate runs the
            # batch before Delta skips its write), which test_jvm_stack proves on a checkpoint made so
            pending = batches(victim.checkpoint, "offsets")[-1:]
            if pending > seen and pending > batches(victim.checkpoint, "commits")[-1:]:
                os.killpg(victim.launcher["pid"], signal.SIGKILL)
                break
            seen = pending
            time.sleep(0.005)
        wait_for(lambda: self.state(victim.id) is State.LOST, "the killed driver to read LOST", 60)
        held = self._sink_holds(victim, pending[0]) if pending else False
        self.check(
            bool(pending),
            f"deployment {victim.id} ({victim.version}) killed with SIGKILL in the middle of batch "
            f"{pending[0] if pending else '-'}, "
            + ("after the table took it (the gate replays it)" if held else "before its write to the table"),
        )
        conf = {"job": JOB, "version": victim.version, "restore": "latest-state", "min_batches": 2}
        result = self._run("savepoints_deploy", conf)
        error = str(result.pushed.get("deploy", {}).get("error", ""))
        deployed = result.value("deploy") if result.succeeded else {}
        source = self.store.get(JOB, deployed["restored_from"]) if deployed.get("restored_from") else None
        self.check(
            source is not None and source.deployment == victim.id and source.pending_batch_id is not None,
            f"deploy DAG from the latest state: {victim.version} again, restored from {deployed.get('restored_from')}, "
            "the killed batch replayed with its logged offsets",
        )
        if not deployed:
            raise RuntimeError(f"the deploy from the latest state failed: {one_line(error, 300)}")
        return Deployments(self.store.storage).get(JOB, deployed["deployment"])

    def _sink_holds(self, deployment: Deployment, batch: int) -> bool:
        """Whether the Delta table already holds `batch` of the deployment's query (False for a file sink)."""
        status = self.status(deployment.id)
        if not self.lake or status is None or status.query_id is None:
            return False
        last = delta_sink.last_batch(self.job.open(table_of(self.lake)), status.query_id, None)
        return last is not None and last >= batch

    def finish(self) -> Manifest:
        """Flush, let the job process everything, stop it with a savepoint, check the output."""
        self.feeder.flush()
        current = self.running()[-1]
        wait_for(lambda: processed(current.checkpoint, self.feeder.ends), "the job to read every record", 240)
        wait_for(lambda: summarize(self.output()).events >= self.feeder.events, "the last windows", 120)
        result = self._run("savepoints_savepoint", {"job": JOB, "stop": True, "pin": False, "label": "reason=final"})
        self.check(result.succeeded and not self.running(), "savepoint DAG with stop: stopped with a savepoint")
        summary = summarize(self.output())
        self.check(
            summary.events == self.feeder.events and not summary.duplicates,
            f"exactly once: {self.feeder.produced} records produced ({self.feeder.events} distinct events), "
            f"{summary.events} counted, {len(summary.duplicates)} windows emitted twice",
        )
        self.check(
            not summary.shared_windows,
            f"every window written by one version, across every upgrade and regrouping (rows per version: "
            f"{summary.versions}; windows with rows of two versions: {len(summary.shared_windows)})",
        )
        self.check(
            "poisoned" not in summary.versions,
            f"the live output holds no row of a rolled-back version (rows per version: {summary.versions})",
        )
        return self.store.get(JOB, result.value("savepoint")["id"])

    def refuse_fresh_start(self) -> None:
        """A fresh start onto the sink the stopped job wrote would re-read the topic from its start: a Delta
        table takes every record again (duplicates), a file sink skips every batch it holds (all lost). The
        deploy DAG is refused before anything is launched, and says why."""
        last, deploys, before = self.deployments()[-1], len(self.deployments()), self._sink_position()
        conf = {"job": JOB, "version": last.version, "restore": "none", "min_batches": 2}
        result = self._run("savepoints_deploy", conf)
        error = result.pushed.get("deploy", {}).get("error", "")
        self.check(
            result.tasks.get("deploy") == "failed"
            and "a fresh start" in error
            and len(self.deployments()) == deploys
            and self._sink_position() == before,
            f"deploy DAG of {last.version} with restore none onto the sink it wrote: refused, nothing started",
        )
        self.say(f"   the refusal: {one_line(error, 300)}")

    def _sink_position(self) -> int | None:
        """The newest Delta table version, or the file sink's last batch."""
        if self.lake:
            return max(delta_sink.commit_keys(self.job.open(table_of(self.lake))), default=None)
        return file_sink.position(self.job.open(str(self.work / "output")))

    def expire(self, final: Manifest) -> None:
        """Kafka retention deletes every record produced: the first savepoint can no longer be restored, the
        final one (every record read) still can."""
        first = self.first_savepoint
        assert first is not None
        [start] = [p.offset[self.topic] for p in source_guard.kafka_of(first)]
        lost = sum(end - int(start.get(str(p), 0)) for p, end in self.feeder.ends.items())
        self.kafka.delete_records(self.topic, dict(self.feeder.ends))
        deploys = len(self.deployments())
        result = self._run("savepoints_deploy", {"job": JOB, "version": "v2", "restore": first.id, "min_batches": 2})
        self.check(
            result.tasks.get("deploy") == "failed" and len(self.deployments()) == deploys,
            f"deploy DAG from savepoint {first.id}: refused before anything started ({lost} of its records are gone)",
        )
        plan = self._run("savepoints_retention", {"dry_run": True}).value("retention")["plan"]
        marked = {u["snapshot"]: u["records_lost"] for u in plan["unrestorable"]}
        self.check(
            marked.get(first.id) == lost and final.id not in marked,
            f"the retention plan marks {first.id} unrestorable ({marked.get(first.id)} records lost); "
            f"the final savepoint {final.id} stays restorable",
        )

    def refuse_replay(self, version: str) -> None:
        """Retention deletes every record the running deployment has read: an upgrade to `version`, which cannot
        take over its state, would have to replay some of them, so it is blocked, naming what is gone."""
        current = self.running()[-1]
        read = {p: o for p, o in committed_offsets(current.checkpoint).items() if o > 0}
        self.kafka.delete_records(self.topic, read)
        record = self.upgrade(version, Outcome.BLOCKED, mode="replay")
        self.check(
            "records are gone" in str(record.error) and f"{self.topic}-" in str(record.error),
            f"replay refused: it would start before what Kafka still holds ({sum(read.values())} records deleted)",
        )

    def refuse_migration(self, version: str) -> None:
        """An upgrade to `version`, whose migration function returns a key twice: stopped before anything starts,
        the error naming the function, the running version untouched."""
        function = self.job.spec.version(version).migrate
        record = self.upgrade(version, Outcome.BLOCKED, mode="migrate")
        self.check(
            str(function) in str(record.error) and not (record.migration or {}).get("passed"),
            f"the migration by {function} was checked on a throwaway copy and refused, naming the function",
        )

    def run(self, *, tour: bool = True, rollback: bool = False, crash: bool = False, abort: bool = True) -> None:
        """The core lifecycle (deploy, a savepoint, retention, a blue/green upgrade, the exactly-once check); with
        `tour`, everything else too: the aborted and rolled-back upgrades (`rollback`; without `abort` only the
        rolled-back one), replay, migration, a crash (`crash`) and the refusals."""
        self.say(f"deploy v1 (deploy DAG), producing events to Kafka topic {self.topic}")
        with BackgroundFeeder(self.feeder) as feeding:
            self.deploy("v1")
            self.say("savepoint (savepoint DAG, as the UI form would trigger it)")
            self.savepoint()
            self.say("retention (retention DAG)")
            self.retention()
            self.say("upgrade to v2 (upgrade DAG; the pre-flight picks the mode)")
            self.upgrade("v2", Outcome.UPGRADED)
            if tour:
                self._tour(feeding, rollback=rollback, crash=crash, abort=abort)
        self.say("stop producing; stop with a savepoint (savepoint DAG); exactly-once check")
        final = self.finish()
        if not tour:
            return
        self.say("a fresh start onto the sink the job wrote (deploy DAG, restore none)")
        self.refuse_fresh_start()
        self.say("Kafka retention deletes the records: the first savepoint can no longer be restored")
        self.expire(final)

    def _tour(self, feeding: BackgroundFeeder, *, rollback: bool, crash: bool, abort: bool) -> None:
        """The rest of the tour, while events are produced: the failed upgrades, replay, migration, the refusals."""
        if rollback and abort:
            self.say("upgrade to poisoned, which fails before its cutover: the upgrade aborts")
            self.upgrade("poisoned", Outcome.ABORTED, feeding, poison=lambda u: _committed(self, u) >= 2)
        if rollback:
            self.say("upgrade to poisoned, which fails after its cutover: the upgrade rolls back")
            self.upgrade("poisoned", Outcome.ROLLED_BACK, feeding, poison=lambda u: u.cut_over)
        self.say("upgrade to v3: a new grouping key, the state cannot be taken over; the pre-flight picks replay")
        self.upgrade("v3", Outcome.UPGRADED)
        self.say("upgrade to by_country with a migration function that returns a key twice: refused")
        self.refuse_migration("by_country_broken")
        self.say("upgrade to by_country (per country): its state migrated from v3's by the version's function")
        self.upgrade("by_country", Outcome.UPGRADED, mode="migrate")
        if crash:
            self.say("SIGKILL the driver mid-batch; deploy DAG from the latest state")
            self.crash()
        self.say("Kafka retention deletes records the running version has read: a replay can no longer start")
        self.refuse_replay("v2")
