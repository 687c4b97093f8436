"""Scripts written the way users write them (tests/scripts/: a Kafka word count, a sessionization; each builds its
query, calls start() and awaitTermination(), knowing nothing of this project), declared in a jobs file as they
are (`script = ...`) and run through a deploy, a savepoint, an upgrade to a second version of the script (its
pre-flight included) and a stop-with-savepoint, events produced all along. Real processes: the session's Kafka
broker, spark-submit drivers, the scripts' Delta tables on local disk. Each word and each event is counted once.

Issue 43: the jobs declare `kafka`, and the word count reads its arguments with a strict argparse (the engine
appended `--kafka-bootstrap-servers`, which it refused); the sessionization's second version appends by a
foreachBatch that writes by batch id, declared `foreach_batch = "idempotent"`, run exactly-once: its driver dies
right after a batch it wrote, and deployed again from its latest state it runs that batch again, written once.

Issue 46: the word count is a declared job (`desired`): `savepoints apply` deploys it, upgrades it when the jobs
file names v2, restarts v2 from its latest state after its driver is SIGKILLed, and, when the file names v3 (a bad
release that fails once it runs), rolls back to v2 and holds v3 until the file changes, words produced all along."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.cli.main import main
from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.observe import state_of
from airflow_plugin.core.jobs.savepoint import take_savepoint
from airflow_plugin.core.jobs.stop import kill
from airflow_plugin.core.reconcile.apply import apply, declared_status
from airflow_plugin.core.reconcile.plan import Action
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import SnapshotStatus
from airflow_plugin.core.sinks.delta import SESSION_CONF
from airflow_plugin.core.spark_app import loopback_env, spark_submit_binary
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Phase, Upgrades
from airflow_plugin.core.upgrades.run import begin, outcome, run_upgrade
from airflow_plugin.core.upgrades.steps import UpgradeSettings
from devtools import jvm
from devtools.feeding import BackgroundFeeder
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import processed
from devtools.windowed import SMALL_DELTA_TABLE, wait_for
from spark_jobs.jobs.windowed.output import read_table

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
WORDS = ("apple", "banana", "cherry", "date", "elder", "fig", "grape")
USERS = ("ann", "bob", "cy")
FLUSH_USER = "flush"  # its one event, far ahead, closes every other session (and its own never closes)


def _job(
    directory: Path, kafka: EmbeddedKafka, job: str, outputs: list[str], v2: str = "", declared: str = ""
) -> tuple[JobContext, str]:
    """Job `job` running tests/scripts/JOB.py as v1 and JOB_v2.py as v2 (with `v2`'s keys) on a topic of its own,
    which the scripts get as their first arguments, then `outputs`; the job and the topic. `declared`: more keys of
    the job (its `desired` state)."""
    topic = f"{job}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    jobs = _jobs_file(directory, kafka, job, [kafka.bootstrap, topic, *outputs], v2, declared)
    return Settings(jobs_file=str(jobs)).resolve().job(job), topic


def _jobs_file(
    directory: Path, kafka: EmbeddedKafka, job: str, args: list[str], v2: str = "", declared: str = ""
) -> Path:
    """The jobs file of `_job`: the scripts' own arguments (nothing else reaches them: the job's `kafka` goes to
    the driver's environment and conf), the connector jars."""
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.jars": ",".join(str(jvm.link(group) / "*.jar") for group in ("spark-kafka", "delta")),
        **SESSION_CONF,
        **SMALL_DELTA_TABLE,
    }
    bad = SCRIPTS / f"{job}_v3.py"  # a bad release, where the script has one: it fails once it runs
    v3 = f'versions.v3 = {{ script = "{bad}" }}' if bad.exists() else ""
    path = directory / "jobs.toml"
    path.write_text(
        f"""
[jobs.{job}]
store = "store"
checkpoint_root = "checkpoints"
log_dir = "logs"
trigger_interval = "1 second"
kafka = {{ bootstrap_servers = "{kafka.bootstrap}" }}
args = {json.dumps(args)}
conf = {{ {", ".join(f'"{key}" = "{value}"' for key, value in conf.items())} }}
versions.v1 = {{ script = "{SCRIPTS / job}.py" }}
versions.v2 = {{ script = "{SCRIPTS / job}_v2.py"{v2} }}
{v3}
{declared}
"""
    )
    return path


class _Producer:
    """Records produced to a topic, and each partition's next offset (what a batch must have read)."""

    def __init__(self, kafka: EmbeddedKafka, topic: str) -> None:
        self.kafka, self.topic = kafka, topic
        self.ends: dict[int, int] = {}

    def send(self, records: list[tuple[str, str]] | list[str]) -> None:
        for partition, offset in self.kafka.produce(self.topic, records):
            self.ends[partition] = max(self.ends.get(partition, 0), offset + 1)


class WordFeeder(_Producer):
    """Lines of words; `counts` is what the word count must end with."""

    def __init__(self, kafka: EmbeddedKafka, topic: str) -> None:
        super().__init__(kafka, topic)
        self.counts: Counter[str] = Counter()
        self.random = random.Random(28)

    def round(self) -> None:
        lines = [" ".join(self.random.choices(WORDS, k=self.random.randint(1, 6))) for _ in range(20)]
        self.counts.update(word for line in lines for word in line.split(" "))
        self.send(lines)


class SessionFeeder(_Producer):
    """Per round, three events a second apart for each user, 30 s of event time after the last round's: one
    session each (the gap is 10 s). `events` is what the closed sessions must count in all."""

    def __init__(self, kafka: EmbeddedKafka, topic: str) -> None:
        super().__init__(kafka, topic)
        self.start = datetime(2026, 1, 1, tzinfo=UTC)
        self.rounds = self.events = 0

    def _at(self, seconds: float) -> str:
        return (self.start + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")

    def round(self) -> None:
        base = self.rounds * 30
        self.send([(user, self._at(base + i)) for user in USERS for i in range(3)])
        self.rounds += 1
        self.events += 3 * len(USERS)

    def flush(self) -> None:
        self.send([(FLUSH_USER, self._at(self.rounds * 30 + 3600))])


_NONE = DeploymentStatus(State.STARTING, 0)


def _run_unmanaged(ctx: JobContext, log: Path) -> subprocess.Popen[bytes]:
    """The job's v1 script as it ran before it was managed: spark-submit by hand, the jobs file's conf and arguments
    (its own checkpoint among them)."""
    conf = [arg for key, value in ctx.spec.conf.items() for arg in ("--conf", f"{key}={value}")]
    script = ctx.spec.versions["v1"].script
    assert script is not None
    command = [spark_submit_binary(), "--master", "local[2]", *conf, script, *ctx.spec.args]
    environment = {**os.environ, **loopback_env("local[2]"), "PYSPARK_PYTHON": sys.executable}
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=environment)


def _applied(ctx: JobContext, action: Action) -> Deployment:
    """`savepoints apply` for the job: it takes `action`, and the job then runs (its newest deployment)."""
    [done] = apply(Settings(jobs_file=ctx.settings.jobs_file).resolve(), [ctx.name])
    assert done.step.action is action and done.ok, done
    return _live(ctx)


def _live(ctx: JobContext) -> Deployment:
    [deployment] = [d for d in ctx.deployments.list(ctx.name) if state_of(ctx, d) is State.RUNNING]
    return deployment


def _rolled_back_and_held(ctx: JobContext, jobs: Path) -> None:
    """The jobs file names v3, a bad release: apply upgrades, v3 fails its health gate once it runs, the upgrade
    rolls v2 back (one writer throughout), v2 stays the last stable version, and the next apply holds v3 instead of
    trying it again; named v2 again, the file changed, apply has nothing to do."""
    jobs.write_text(jobs.read_text().replace('version = "v2"', 'version = "v3"'))
    declared = Settings(jobs_file=str(jobs)).resolve()
    [failed] = apply(declared, [ctx.name])
    assert failed.step.action is Action.UPGRADE and not failed.ok, failed
    upgrade = Upgrades(ctx.store.storage).newest(ctx.name)
    assert upgrade is not None and upgrade.to_version == "v3" and upgrade.phase is Phase.ROLLED_BACK, upgrade
    assert "DELTA_METADATA_MISMATCH" in str(upgrade.error), upgrade.error  # v3's own failure, once it ran
    assert _live(ctx).version == "v2"
    status = declared_status(declared.job(ctx.name))
    assert status is not None and status["last_stable_version"] == "v2" and status["held_versions"] == ["v3"], status
    [held] = apply(Settings(jobs_file=str(jobs)).resolve(), [ctx.name])
    assert held.step.action is Action.HOLD and held.ok, held
    assert Upgrades(ctx.store.storage).newest(ctx.name).id == upgrade.id, "v3 not tried again"  # type: ignore[union-attr]
    jobs.write_text(jobs.read_text().replace('version = "v3"', 'version = "v2"'))
    [settled] = apply(Settings(jobs_file=str(jobs)).resolve(), [ctx.name])
    assert settled.step.action is Action.NOTHING, settled


def _through_the_lifecycle(
    ctx: JobContext,
    feeder: _Producer,
    complete: Callable[[], bool],
    last: Callable[[], None] | None = None,
    upgraded: Callable[[], None] | None = None,
    declared: bool = False,
) -> None:
    """Deploy v1, savepoint it, upgrade it to v2 (then `upgraded`, events still produced), then (all produced and
    read, the output `complete`) stop it with a savepoint. `declared`: the job declares its desired version, and
    `savepoints apply` deploys it, upgrades it once the jobs file says v2, restarts v2 after its driver is
    SIGKILLed, and rolls back a v3 that fails its health gate, holding it."""
    records = ctx.deployments
    try:
        with BackgroundFeeder(feeder, interval=1.0):
            first = _applied(ctx, Action.DEPLOY) if declared else deploy(ctx, DeployRequest("v1"))
            # RUNNING is the first trigger done; a savepoint needs a committed batch (a first trigger may find none)
            wait_for(lambda: (records.status(ctx.name, first.id) or _NONE).last_batch_id is not None, "a batch", 240)
            status = records.status(ctx.name, first.id)
            assert status is not None and status.error_class is None, status
            savepoint = take_savepoint(ctx)
            assert savepoint.status is SnapshotStatus.COMPLETED and savepoint.query_id == status.query_id
            if declared:
                jobs = Path(str(ctx.settings.jobs_file))
                jobs.write_text(jobs.read_text().replace('version = "v1"', 'version = "v2"'))
                ctx = Settings(jobs_file=str(jobs)).resolve().job(ctx.name)
                _applied(ctx, Action.UPGRADE)
                upgrade = Upgrades(ctx.store.storage).newest(ctx.name)
                assert upgrade is not None
                killed = _live(ctx)
                os.killpg(killed.launcher["pid"], signal.SIGKILL)  # the driver dies: the loop restarts it
                wait_for(lambda: state_of(ctx, killed) is State.LOST, "the killed driver to read LOST")
                restarted = _applied(ctx, Action.RESTART)
                assert restarted.version == "v2" and restarted.restored_batch_id is not None, restarted
                _rolled_back_and_held(ctx, jobs)
            else:
                upgrade = run_upgrade(ctx, begin(ctx, "v2", settings=UpgradeSettings(min_batches=2)))
                outcome(upgrade)
            assert upgrade.phase is Phase.DONE and upgrade.mode == "stop_restore", upgrade
            if upgraded is not None:
                upgraded()
        if last is not None:
            last()
        second = _live(ctx)
        assert second.version == "v2" and second.id != first.id
        wait_for(lambda: processed(second.checkpoint, dict(feeder.ends)), "v2 to read every record", 240)
        wait_for(complete, "the output to be complete", 120)
        final = take_savepoint(ctx, stop_after=True)
        assert final.status is SnapshotStatus.COMPLETED
        stopped = records.status(ctx.name, second.id)
        assert stopped is not None and stopped.state is State.STOPPED, stopped
    finally:
        for deployment in records.list(ctx.name):
            with contextlib.suppress(SavepointsError):
                kill(ctx, deployment.id)


@pytest.mark.timeout(900)
def test_a_word_count_script_counts_every_word_once_through_savepoints_and_an_upgrade(
    tmp_path: Path, kafka: EmbeddedKafka
) -> None:
    table, own_checkpoint = tmp_path / "counts", tmp_path / "the-scripts-own-checkpoint"
    # taken over from its unmanaged run (writing-a-job.md, "Take over a query that already runs"), then deployed,
    # upgraded and restarted by `savepoints apply`
    declared = 'desired = { version = "v1", restore = "latest-savepoint" }\nrestart = { delay = "0s" }'
    ctx, topic = _job(tmp_path, kafka, "word_count", [str(table), str(own_checkpoint)], declared=declared)
    feeder = WordFeeder(kafka, topic)

    def counts() -> dict[str, int]:
        return {row["word"]: row["count"] for row in read_table(open_storage(str(table)))}

    unmanaged = _run_unmanaged(ctx, tmp_path / "unmanaged.log")
    try:
        for _ in range(3):
            feeder.round()
        wait_for(lambda: processed(str(own_checkpoint), dict(feeder.ends)), "the unmanaged query to read it all", 300)
        wait_for(lambda: counts() == feeder.counts, "its table to hold every word", 60)
    finally:
        os.killpg(unmanaged.pid, signal.SIGTERM)  # stopped as its owner stops it
        unmanaged.wait(timeout=120)
    taken = ["create", "word_count", "--checkpoint", str(own_checkpoint), "--sink", str(table), "--json"]
    assert main([*taken, "--jobs", str(ctx.settings.jobs_file)]) == 0
    commits = sorted(p.name for p in (own_checkpoint / "commits").iterdir())

    _through_the_lifecycle(ctx, feeder, lambda: counts() == feeder.counts, declared=True)

    first = ctx.deployments.list(ctx.name)[0]
    assert first.restored_from is not None, "deployed from the snapshot of its unmanaged run"
    manifest = ctx.store.get(ctx.name, first.restored_from)
    assert [sink["kind"] for sink in manifest.sinks] == ["delta"], "its sink recorded"
    status = ctx.deployments.status(ctx.name, first.id)
    assert status is not None and any(str(own_checkpoint) in warning for warning in status.warnings)
    assert sorted(p.name for p in (own_checkpoint / "commits").iterdir()) == commits, "the deployments' own"
    assert counts() == dict(feeder.counts), "every word counted once, before and after the takeover"


@pytest.mark.timeout(900)
def test_a_sessionization_script_counts_every_event_once_through_savepoints_an_upgrade_and_a_replay(
    tmp_path: Path, kafka: EmbeddedKafka
) -> None:
    table, crash = tmp_path / "sessions", tmp_path / "sessions.crash"
    ctx, topic = _job(tmp_path, kafka, "sessions", [str(table)], v2=', foreach_batch = "idempotent"')
    feeder = SessionFeeder(kafka, topic)

    def rows() -> list[dict[str, Any]]:
        return read_table(open_storage(str(table))) if (table / "_delta_log").is_dir() else []

    def crashed_and_restarted() -> None:
        """v2 dies right after its foreachBatch wrote a batch of sessions, before Spark recorded the batch done;
        deployed again (from its latest state, the default) it runs that batch again, and Delta takes it once."""
        v2 = _live(ctx)
        crash.touch()
        wait_for(lambda: crash.read_text() != "" and state_of(ctx, v2) is not State.RUNNING, "v2 to die", 180)
        batch = int(crash.read_text())
        assert not (Path(v2.checkpoint) / "commits" / str(batch)).exists(), "written, never recorded done"
        restarted = deploy(ctx, DeployRequest("v2"))
        assert restarted.restored_batch_id == batch - 1 and restarted.fresh_start is None, restarted
        wait_for(lambda: (Path(restarted.checkpoint) / "commits" / str(batch)).exists(), "the batch run again", 120)

    def complete() -> bool:
        return len(rows()) >= feeder.rounds * len(USERS)

    _through_the_lifecycle(ctx, feeder, complete, feeder.flush, crashed_and_restarted)
    assert crash.read_text(), "the replay happened"

    found = rows()
    sessions = Counter((row["user"], row["session_start"]) for row in found)
    assert [key for key, times in sessions.items() if times > 1] == [], "no session written twice"
    assert {row["events"] for row in found} == {3} and len(found) == feeder.rounds * len(USERS)
    assert sum(row["events"] for row in found) == feeder.events, "every event counted once"
