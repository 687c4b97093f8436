"""One resolved context for everything a command, an operator or a DAG does to a job (the Flink operator's
FlinkResourceContext): the jobs file, the snapshot store, S3 access, the spark-submit builder, who asks and
where progress goes. It is resolved ONCE, at the edge (CLI, Airflow hook), and handed down; nothing below
looks up a setting again.

Precedence, one rule for every setting that has several sources: flag > environment > jobs file > default.

    jobs file   --jobs FILE          > $SAVEPOINTS_JOBS   > ./jobs.toml
    store       --store URI          > $SAVEPOINTS_STORE  > the job's `store` (or [defaults])  > none: an error
    S3 access   an Airflow AWS connection > boto3's own chain (AWS_ENDPOINT_URL, AWS_PROFILE, role, ...)
    Kafka       --kafka-bootstrap or an Airflow Kafka connection > $SAVEPOINTS_KAFKA_BOOTSTRAP > the job's
                `kafka` table > none (a snapshot with Kafka offsets then cannot be checked: restores refuse)

S3 access reaches every location the same way: the store, checkpoints and sinks are opened through
`open`, and launched drivers get it in their environment (`child_env`), never on their command line. So does the
broker of a job that declares `kafka`: in the driver's environment and Spark conf (`child_env`, `child_conf`),
never among the job's arguments (a script's own argparse would refuse it)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from ..errors import InvalidInput, NotFound
from ..lease import DEFAULT_TTL
from ..parallel import DEFAULT_CONCURRENCY
from ..progress import NullProgress, Progress
from ..sinks.delta import CONF_PREFIX as DELTA_CONF
from ..snapshots.store import SnapshotStore
from ..sources.kafka import KAFKA_CONF, KAFKA_ENV, KafkaSettings
from ..spark_app import SparkAccess
from ..storage import S3Settings, Storage, open_storage
from ..storage.hdfs import STORE_REFUSAL
from ..storage.s3 import S3A
from .deployments import Deployments
from .launcher import CommandBuilder, default_command
from .spec import JOBS_ENV, JobSpec, jobs_file, load_jobs

log = logging.getLogger(__name__)

STORE_ENV = "SAVEPOINTS_STORE"


@dataclass(frozen=True)
class Settings:
    """What the caller brings: its flags, an Airflow connection's S3 access, its spark-submit builder."""

    jobs_file: str | None = None  # None: $SAVEPOINTS_JOBS, else ./jobs.toml
    store: str | None = None  # None: $SAVEPOINTS_STORE, else the jobs file's
    s3: S3Settings | None = None  # None: boto3's own chain
    kafka: KafkaSettings | None = None  # a broker from a flag or an Airflow connection: wins over the jobs file
    command_builder: CommandBuilder = default_command
    progress: Progress = field(default_factory=NullProgress)
    requested_by: str = ""
    # The same id on a retry of the same request (an Airflow task's try): what it already made is taken
    # over, never made twice (one deployment, one COMPLETED snapshot). None: every call is a new request.
    request_id: str | None = None
    concurrency: int = DEFAULT_CONCURRENCY  # parallel transfers of one operation
    holder: str | None = None  # who holds a job's lease while changing it (default: user@host:pid)
    lease_ttl: float = DEFAULT_TTL  # seconds; renewed every third of it while the operation runs
    keep_lease: bool = False  # leave the lease held after an operation: a later step of this holder goes on

    def resolve(self) -> Context:
        return Context(self, Environment.read())


@dataclass(frozen=True)
class Environment:
    """The environment variables settings come from, read once where settings are resolved (`Settings.resolve`):
    nothing below reads them again."""

    jobs_file: str | None = None  # $SAVEPOINTS_JOBS
    store: str | None = None  # $SAVEPOINTS_STORE
    kafka_bootstrap: str | None = None  # $SAVEPOINTS_KAFKA_BOOTSTRAP

    @classmethod
    def read(cls) -> Environment:
        return cls(*(os.environ.get(name) or None for name in (JOBS_ENV, STORE_ENV, KAFKA_ENV)))


class Context:
    """The jobs file and the store, resolved once per command, task or page request."""

    def __init__(self, settings: Settings, environment: Environment | None = None) -> None:
        self.settings = settings
        self.environment = environment or Environment()
        self.jobs_path: Path = jobs_file(settings.jobs_file or self.environment.jobs_file)

    @cached_property
    def jobs(self) -> dict[str, JobSpec]:
        """Every declared job; a missing or invalid jobs file is an error naming it."""
        return load_jobs(str(self.jobs_path))

    @property
    def jobs_file_given(self) -> bool:
        """Whether a jobs file was asked for (flag or environment) rather than the ./jobs.toml default."""
        return bool(self.settings.jobs_file or self.environment.jobs_file)

    def declared_jobs(self) -> dict[str, JobSpec]:
        """The declared jobs, or none when no jobs file was asked for and ./jobs.toml does not exist (commands
        that work on any store, such as `list`, need no jobs file)."""
        if not self.jobs_file_given and not self.jobs_path.exists():
            return {}
        return self.jobs

    def spec(self, name: str) -> JobSpec:
        """A declared job; with no jobs file at all (none asked for, no ./jobs.toml) a job known by name only."""
        if not self.jobs_file_given and not self.jobs_path.exists():
            return JobSpec.undeclared(name)
        jobs = self.jobs
        if name not in jobs:
            declared = ", ".join(sorted(jobs)) or "none"
            raise NotFound(f"unknown job {name!r} in {self.jobs_path}: declared jobs are {declared}")
        return jobs[name]

    def store_uri(self, job: str | None = None) -> str:
        """flag > $SAVEPOINTS_STORE > the job's store in the jobs file > the one store its jobs share."""
        uri = self.settings.store or self.environment.store
        if not uri:
            jobs = self.declared_jobs()
            if job is not None and job in jobs:
                uri = jobs[job].store
            else:
                stores = sorted({spec.store for spec in jobs.values() if spec.store})
                if len(stores) > 1:
                    raise InvalidInput(
                        f"the jobs in {self.jobs_path} use {len(stores)} stores ({', '.join(stores)}): name one "
                        f"with --store or {STORE_ENV}" + ("" if job else ", or name a declared job")
                    )
                uri = stores[0] if stores else None
        if not uri:
            raise InvalidInput(
                f"no snapshot store: pass --store URI, set {STORE_ENV}, or declare `store` in the jobs file "
                f"({self.jobs_path})"
            )
        if uri.strip().lower().startswith("hdfs:"):
            raise InvalidInput(f"snapshot store {uri}: {STORE_REFUSAL}")
        return uri

    def store(self, job: str | None = None) -> SnapshotStore:
        return SnapshotStore(self.open(self.store_uri(job)))

    def open(self, uri: str) -> Storage:
        """Any location (store, checkpoint, sink) with this context's S3 access."""
        return open_storage(uri, self.settings.s3)

    def kafka(self, job: str) -> KafkaSettings | None:
        """The broker of a job's Kafka sources (a job of the store that the jobs file does not declare too)."""
        return resolve_kafka(self.settings.kafka, self.declared_jobs().get(job), self.environment.kafka_bootstrap)

    def job(self, name: str) -> JobContext:
        spec = self.spec(name)
        return JobContext(spec, self.store(name), self.settings, self.environment)

    def snapshots_of(self, name: str) -> JobContext:
        """The context of a job whose snapshots a command works on: the declared job, or one known by name
        only (snapshots of any checkpoint can be taken with `savepoints create NAME --checkpoint LOCATION`)."""
        jobs = self.declared_jobs()
        spec = jobs[name] if name in jobs else JobSpec.undeclared(name)
        return JobContext(spec, self.store(name), self.settings, self.environment)


@dataclass(frozen=True)
class JobContext:
    """Everything one operation on one job needs, resolved: its spec, its store, S3 access, the
    spark-submit builder, who asks and where progress goes."""

    spec: JobSpec
    store: SnapshotStore
    settings: Settings = field(default_factory=Settings)
    environment: Environment = field(default_factory=Environment)

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def kafka(self) -> KafkaSettings | None:
        """The broker its Kafka sources read, whose offsets every restore checks (None: none known)."""
        return resolve_kafka(self.settings.kafka, self.spec, self.environment.kafka_bootstrap)

    @property
    def progress(self) -> Progress:
        return self.settings.progress

    @property
    def requested_by(self) -> str:
        return self.settings.requested_by

    @property
    def command_builder(self) -> CommandBuilder:
        return self.settings.command_builder

    @cached_property
    def deployments(self) -> Deployments:
        return Deployments(self.store.storage)

    def open(self, uri: str) -> Storage:
        """A checkpoint or sink location of this job, with the same S3 access as the store."""
        return open_storage(uri, self.settings.s3)

    def child_env(self, *, lasting: bool = False) -> dict[str, str]:
        """What a launched driver or Spark tool needs in its environment: the store's S3 access, as we have it, and
        the broker of a job that declares a `kafka` table ($SAVEPOINTS_KAFKA_BOOTSTRAP, see `driver_broker`).
        `lasting`: for a deployment's driver, which outlives any session's credentials (S3Settings.child_env)."""
        env = self.settings.s3.child_env(lasting=lasting) if self.settings.s3 else {}
        broker = self.driver_broker()
        return {**env, KAFKA_ENV: broker} if broker else env

    def child_conf(self) -> dict[str, str]:
        """What a launched driver needs in its Spark conf besides the job's: the broker of a job that declares a
        `kafka` table (KAFKA_CONF), which reaches a driver in a cluster's container, where the environment of
        spark-submit does not."""
        broker = self.driver_broker()
        return {KAFKA_CONF: broker} if broker else {}

    def driver_broker(self) -> str | None:
        """The broker a job that declares a `kafka` table reads: the one every restore checks, its address resolved
        here with the same precedence. Handed over in the driver's environment and conf, never among the job's
        arguments: a script's own argparse would refuse one it did not ask for."""
        if self.spec.kafka is None or self.kafka is None:
            return None
        return self.kafka.bootstrap_servers

    def spark_conf(self) -> dict[str, str]:
        """What every Spark process of this job (its drivers, pre-flight, rescale, a sink's rewind) needs
        besides its own conf: the job's jars, S3A and Delta settings, under them the S3A settings of the
        store's S3 (storage/s3.py) when its checkpoints or the store are on S3 (its sink may be too). Never a
        key."""
        own = {
            key: value
            for key, value in self.spec.conf.items()
            if key in ("spark.jars", "spark.jars.packages") or key.startswith((S3A, DELTA_CONF))
        }
        if not self.spec.checkpoint_root.startswith("s3a://") and self.settings.s3 is None:
            return own
        return {**(self.settings.s3 or S3Settings()).spark_conf(), **own}

    def spark_access(self) -> SparkAccess:
        """The conf and environment of a Spark tool that works on this job's locations."""
        return SparkAccess(self.spark_conf(), self.child_env())

    def checkpoint_location(self, deployment_id: str) -> str:
        """Each deployment's own live checkpoint location."""
        return f"{self.spec.checkpoint_root.rstrip('/')}/{self.name}/{deployment_id}"

    def at_size(self, size: int | None) -> JobContext:
        """The context whose launches run at `size` of the job's autoscaler knob (JobSpec.sized)."""
        return self if size is None else replace(self, spec=self.spec.sized(size))

    def with_progress(self, progress: Progress) -> JobContext:
        return replace(self, settings=replace(self.settings, progress=progress))


def resolve_kafka(
    edge: KafkaSettings | None, spec: JobSpec | None, environment: str | None = None
) -> KafkaSettings | None:
    """The broker's address: flag or connection > `environment` ($SAVEPOINTS_KAFKA_BOOTSTRAP) > the job's `kafka`
    table. Its client settings come with the address from a connection, else from the jobs file."""
    declared = spec.kafka if spec is not None else None
    address = (
        (edge.bootstrap_servers if edge else None) or environment or (declared.bootstrap_servers if declared else None)
    )
    if not address:
        return None
    config = (edge.config if edge and edge.config else None) or (declared.config if declared else {})
    timeout = edge.timeout_s if edge else declared.timeout_s if declared else KafkaSettings(address).timeout_s
    return KafkaSettings(address, dict(config), timeout)
