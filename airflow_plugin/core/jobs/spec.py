"""Jobs are declared once, in a TOML file that the CLI and the DAGs both read (`jobs.toml` by default,
or `--jobs FILE` / `SAVEPOINTS_JOBS`). Relative paths in it are relative to the file's directory; a
relative application that is not there is looked up in the installed Python packages (sys.path), so
`spark_jobs/jobs/windowed/v1.py` finds the example job of an installed wheel wherever the file is copied.
docs/jobs-file.md describes every key.

    [defaults]                     # applies to every job unless the job says otherwise
    store = "s3://savepoints/store"
    checkpoint_root = ".runs/checkpoints"
    spark_master = "local[2]"

    [jobs.windowed_counts]
    kafka = { bootstrap_servers = "broker:9092" }   # only for a job that reads Kafka (sources/kafka.py)
    trigger_interval = "2 seconds"
    delivery = "exactly-once"
    default_version = "v1"
    args = ["--input", ".runs/input", "--output", ".runs/output"]
    conf = { "spark.sql.shuffle.partitions" = "3" }
    versions.v1 = { application = "spark_jobs/jobs/windowed/v1.py" }
    versions.v2 = { script = "jobs/my_script.py", foreach_batch = "idempotent" }  # a script, as it is
    retention.savepoint = { keep_last = 10 }
    desired = { state = "running", version = "v1" }   # what `savepoints apply` keeps running (core/reconcile/)
    restart = { attempts = 5, window = "1 hour" }     # its restarts after a failure
    autoscale = { max = 4 }                           # its size, on the loop (core/autoscale/)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..autoscale.policy import Autoscale, parse_autoscale, size_of, sized
from ..durations import duration_seconds
from ..errors import InvalidInput, NotFound
from ..records.manifest import check_name
from ..sources.kafka import DEFAULT_TIMEOUT_S, KafkaSettings

JOBS_ENV = "SAVEPOINTS_JOBS"
DEFAULT_JOBS_FILE = "jobs.toml"
DELIVERY = ("at-most-once", "at-least-once", "exactly-once")
_PATH_ARGS = ("--input", "--output")  # job arguments whose values are paths
_PATH_CONFS = ("spark.jars",)  # Spark confs whose values are comma-separated paths (spark-submit expands globs)
# what a script version may declare of its foreachBatch: it writes by batch id, so a replayed batch overwrites (or
# is skipped by) what its first run wrote; the delivery check then counts it an idempotent sink
IDEMPOTENT = "idempotent"
# where a deploy's state comes from unless told (`savepoints deploy`, DeployJobOperator, the deploy DAG, a declared
# job's first start): a job with history continues from its latest state, one that never started a query starts fresh
DEFAULT_RESTORE = "latest-state"
RESTORE_MODES = ("latest-state", "latest-savepoint", "none")  # the default first; or a snapshot id
RUNNING, STOPPED = "running", "stopped"  # what a declared job's `desired.state` may say
UPGRADE_MODES = ("auto", "blue_green", "stop_restore", "replay", "migrate")  # auto: the pre-flight's choice


@dataclass(frozen=True)
class Desired:
    """What should run, as the jobs file declares it (`desired = {...}`): `savepoints apply` makes it so."""

    state: str = RUNNING
    version: str = ""  # the job's default_version when the table names none
    upgrade_mode: str = "auto"
    restore: str = DEFAULT_RESTORE  # a first start's state


@dataclass(frozen=True)
class RestartPolicy:
    """How `savepoints apply` restarts a deployment that failed or was lost (`restart = {...}`): after `delay`,
    doubled each time up to `max_delay` (with jitter), at most `attempts` times in `window` (Flink's
    exponential-delay strategy, with a failure-rate budget)."""

    attempts: int = 5
    window: float = 3600.0
    delay: float = 10.0
    max_delay: float = 300.0


@dataclass(frozen=True)
class VersionSpec:
    name: str
    application: str  # a .py file given to spark-submit, under the runtime's contract; "" for a script version
    conf: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    # "package.module:function": turns the old state into this version's initial state in an upgrade whose state
    # changes (core/upgrades/migration.py); None: such an upgrade replays instead, where it can
    migrate: str | None = None
    # an ordinary streaming script run as it is, its query taken over when it starts (spark_jobs/runtime/script.py);
    # a version has an application or a script
    script: str | None = None
    # a script version's time from its start to its query's start, "5 minutes" by default (a script that reads a
    # large input first needs more): past it, the deployment is refused (SCRIPT_START_TIMEOUT)
    start_timeout: str | None = None
    # a script version's declaration that its foreachBatch writes by batch id ("idempotent"): exactly-once then
    # takes it as SinkKind.IDEMPOTENT_FOREACH_BATCH (an application declares its sink in its build instead)
    foreach_batch: str | None = None

    @property
    def code(self) -> str:
        """The file with the version's code: its script or its application."""
        return self.script or self.application


@dataclass(frozen=True)
class JobSpec:
    name: str
    versions: dict[str, VersionSpec]
    default_version: str
    store: str | None  # the snapshot store; $SAVEPOINTS_STORE and --store win over it (context.py)
    checkpoint_root: str
    log_dir: str = ".runs/logs"  # spark-submit output of local and client-mode deployments
    spark_master: str = "local[2]"
    deploy_mode: str = "client"
    trigger_interval: str = "5 seconds"
    delivery: str = "exactly-once"
    conf: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    heartbeat_timeout: float = 30.0
    # a pre-flight's or a migration check's throwaway Spark application is killed after this (seconds): it runs
    # the snapshot's batch, which on a state of many partitions on a slow store takes minutes
    preflight_timeout: float = 600.0
    retention: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    kafka: KafkaSettings | None = None  # the broker a Kafka job reads; the engine checks offsets against it
    desired: Desired | None = None  # what should run (None: `savepoints apply` leaves the job to people)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    autoscale: Autoscale | None = None  # how `savepoints apply` sizes it (core/autoscale/); None: left as declared
    # the job's declaration as written (its table over [defaults]), hashed: a version that failed under one is not
    # tried again by `savepoints apply` until the declaration changes
    fingerprint: str = ""

    @classmethod
    def undeclared(cls, name: str) -> JobSpec:
        """A job known only by name, for commands that need no jobs file (retained checkpoints and status
        of its deployments, from the store alone): defaults everywhere, no versions to launch."""
        return cls(name=check_name(name, "job name"), versions={}, default_version="", store=None, checkpoint_root="")

    @property
    def trigger_seconds(self) -> float:
        return duration_seconds(self.trigger_interval, f"job {self.name} trigger_interval", positive=True)

    @property
    def version_names(self) -> list[str]:
        """The declared versions in natural order (v2 before v10), as every list of them shows them."""
        return version_order(self.versions)

    def version(self, name: str | None) -> VersionSpec:
        name = name or self.default_version
        if not self.versions:
            raise NotFound(f"job {self.name} is not declared in a jobs file: declare it there (or pass --jobs FILE)")
        if name not in self.versions:
            raise NotFound(
                f"job {self.name} has no version {name!r}: declared versions are {', '.join(self.version_names)}"
            )
        return self.versions[name]

    def sized(self, size: int | None) -> JobSpec:
        """The job at `size` of its autoscaler's knob (its master's cores, or its executors); as declared for
        None or a job without `autoscale`."""
        if size is None or self.autoscale is None:
            return self
        knob = self.autoscale.knob_for(self.spark_master)
        master, conf = sized(knob, size, self.spark_master, self.conf)
        # a version's confs come after the job's at every launch: the size goes over them too
        versions = {n: replace(v, conf=sized(knob, size, master, v.conf)[1]) for n, v in self.versions.items()}
        return replace(self, spark_master=master, conf=conf, versions=versions)

    def size_of(self, master: str | None, conf: dict[str, str]) -> int | None:
        """The size a deployment launched with `master` and `conf` runs at, on the autoscaler's knob (None: the
        job has no autoscale). A deployment recorded before its master was (None) ran the declared one."""
        if self.autoscale is None:
            return None
        return size_of(self.autoscale.knob_for(self.spark_master), master or self.spark_master, conf)

    def launchable(self, name: str | None) -> VersionSpec:
        """The version, checked before anything is launched or written: its application exists."""
        version = self.version(name)
        key = "script" if version.script else "application"
        if "://" not in version.code and not Path(version.code).is_file():
            raise NotFound(
                f"the {key} of job {self.name} version {version.name}, {version.code}, does not "
                f"exist: fix versions.{version.name}.{key} in the jobs file"
            )
        return version


def version_order(names: Iterable[str]) -> list[str]:
    """Version names in natural order: their runs of digits compared as numbers, so "v2" comes before "v10"
    (and "v1.9" before "v1.10"); the one order of every list of versions (the CLI's, the DAG forms', the page's)."""
    return sorted(names, key=_natural_key)


def _natural_key(name: str) -> tuple[tuple[str | int, ...], str]:
    # re.split with a group alternates text and digits, text first: position by position the types agree
    parts = re.split(r"(\d+)", name)
    return tuple(int(part) if i % 2 else part.casefold() for i, part in enumerate(parts)), name


def jobs_file(path: str | None = None) -> Path:
    return Path(path or os.environ.get(JOBS_ENV) or DEFAULT_JOBS_FILE).expanduser().absolute()


def _resolve(base: Path, value: str) -> str:
    """Relative local paths are relative to the jobs file; URIs stay as they are."""
    if "://" in value or value.startswith("file:") or Path(value).is_absolute():
        return value
    return str((base / value).resolve())


# a key of [defaults] or of a [jobs.NAME] table
JOB_KEYS = frozenset(f.name for f in fields(JobSpec)) - {"name", "fingerprint"}
VERSION_KEYS = frozenset(f.name for f in fields(VersionSpec)) - {"name"}


def _known(table: Any, allowed: frozenset[str] | set[str], where: str) -> None:
    """A misspelt key would silently fall back to its default: name it instead."""
    if not isinstance(table, dict):
        raise InvalidInput(f"{where} must be a table of settings")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise InvalidInput(f"{where} has unknown key(s) {', '.join(unknown)}: known are {', '.join(sorted(allowed))}")


_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _migrate(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _FUNCTION.match(value):
        raise InvalidInput(f'{where} = {value!r}: give a function as "package.module:function"')
    return value


def _start_timeout(value: Any, where: str) -> str | None:
    """A duration ("10 minutes") or a number of seconds, as the seconds the script runner takes (a string, as a
    command line takes it)."""
    return None if value is None else f"{_timeout(value, where):g}"


def _foreach_batch(spec: dict[str, Any], where: str) -> str | None:
    """`foreach_batch = "idempotent"`: only a script's, only that value."""
    value = spec.get("foreach_batch")
    if value is None:
        return None
    if "script" not in spec:
        raise InvalidInput(
            f"{where}: foreach_batch declares a script's foreachBatch idempotent; an application declares its sink in "
            "its build (StreamingJob(writer, sink=SinkKind.IDEMPOTENT_FOREACH_BATCH)): drop foreach_batch"
        )
    if value != IDEMPOTENT:
        raise InvalidInput(
            f'{where}.foreach_batch = {value!r}: the one value is "{IDEMPOTENT}", for a script whose foreachBatch '
            "writes by batch id (a replayed batch overwrites what it wrote); leave the key out otherwise"
        )
    return value


def _timeout(value: Any, where: str) -> float:
    """A positive duration ("10 minutes", "1 hour") or a plain number of seconds (core/durations.py)."""
    return duration_seconds(value, where, bare_unit="s", positive=True)


def _application(base: Path, value: str) -> str:
    """A job's .py file: next to the jobs file, else in an installed package, else (missing) next to it."""
    resolved = _resolve(base, value)
    if resolved == value or Path(resolved).exists():
        return resolved
    for entry in sys.path:
        candidate = Path(entry or ".") / value
        if candidate.is_file():
            return str(candidate.resolve())
    return resolved


def _strings(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be a table of settings")
    return {str(k): str(v) for k, v in value.items()}


def _conf(value: Any, base: Path, where: str) -> dict[str, str]:
    """Spark confs; the paths in `spark.jars` are relative to the jobs file like every other path in it."""
    conf = _strings(value, where)
    for key in _PATH_CONFS:
        if key in conf:
            conf[key] = ",".join(_resolve(base, part.strip()) for part in conf[key].split(",") if part.strip())
    return conf


def _args(value: Any, base: Path, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{where} must be a list of strings")
    return [_resolve(base, v) if i > 0 and value[i - 1] in _PATH_ARGS else v for i, v in enumerate(value)]


def _kafka(value: Any, where: str) -> KafkaSettings | None:
    """`kafka = { bootstrap_servers = "host:9092", config = { ... client settings ... }, timeout = 10 }`."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value.get("bootstrap_servers"):
        example = 'kafka = { bootstrap_servers = "broker:9092" }'
        raise InvalidInput(f"{where} kafka needs bootstrap_servers, e.g. {example}")
    timeout = _timeout(value.get("timeout", DEFAULT_TIMEOUT_S), f"{where} kafka.timeout")
    config = _strings(value.get("config", {}), f"{where} kafka.config")
    return KafkaSettings(str(value["bootstrap_servers"]), config, timeout)


def _desired(value: Any, versions: dict[str, VersionSpec], default_version: str, where: str) -> Desired | None:
    """`desired = { state = "running", version = "v2", upgrade_mode = "auto", restore = "latest-state" }`."""
    if value is None:
        return None
    _known(value, {f.name for f in fields(Desired)}, f"{where} desired")
    state = str(value.get("state", RUNNING))
    if state not in (RUNNING, STOPPED):
        raise InvalidInput(f'{where} desired.state = {state!r}: use "{RUNNING}" or "{STOPPED}"')
    version = str(value.get("version", default_version))
    if version not in versions:
        declared = ", ".join(version_order(versions))
        raise InvalidInput(f"{where} desired.version = {version!r} is not a declared version: declared are {declared}")
    mode = str(value.get("upgrade_mode", "auto"))
    if mode not in UPGRADE_MODES:
        raise InvalidInput(f"{where} desired.upgrade_mode = {mode!r}: use one of {', '.join(UPGRADE_MODES)}")
    restore = str(value.get("restore", DEFAULT_RESTORE))
    if not restore:
        raise InvalidInput(f"{where} desired.restore is empty: use {', '.join(RESTORE_MODES)} or a snapshot id")
    return Desired(state, version, mode, restore)


def _restart(value: Any, where: str) -> RestartPolicy:
    """`restart = { attempts = 5, window = "1 hour", delay = "10 seconds", max_delay = "5 minutes" }`."""
    if value is None:
        return RestartPolicy()
    _known(value, {f.name for f in fields(RestartPolicy)}, f"{where} restart")
    attempts = value.get("attempts", RestartPolicy.attempts)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        raise InvalidInput(f"{where} restart.attempts = {attempts!r}: give a whole number, 0 for no restart")
    policy = RestartPolicy(
        attempts=attempts,
        window=_timeout(value.get("window", RestartPolicy.window), f"{where} restart.window"),
        delay=duration_seconds(value.get("delay", RestartPolicy.delay), f"{where} restart.delay", bare_unit="s"),
        max_delay=_timeout(value.get("max_delay", RestartPolicy.max_delay), f"{where} restart.max_delay"),
    )
    if policy.max_delay < policy.delay:
        raise InvalidInput(f"{where} restart.max_delay is shorter than restart.delay: make it at least as long")
    return policy


def _fingerprint(merged: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(merged, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_jobs(path: str | None = None) -> dict[str, JobSpec]:
    """Parse and validate the jobs file; every error names the file and the key."""
    file = jobs_file(path)
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise NotFound(f"jobs file {file} does not exist: pass --jobs FILE or set {JOBS_ENV}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"jobs file {file} is not valid TOML: {exc}") from None
    base = file.parent
    _known(data, {"defaults", "jobs"}, f"jobs file {file}")
    defaults = data.get("defaults", {})
    _known(defaults, JOB_KEYS, f"{file} [defaults]")
    jobs = {}
    for name, raw in (data.get("jobs") or {}).items():
        where = f"{file} [jobs.{name}]"
        check_name(name, "job name")
        _known(raw, JOB_KEYS, where)
        merged = {**defaults, **raw}
        versions = {}
        for version, spec in (merged.get("versions") or {}).items():
            if not isinstance(spec, dict) or ("application" in spec) == ("script" in spec):
                raise InvalidInput(
                    f"{where} version {version!r} needs an application (a .py file with a build function) or a "
                    "script (an ordinary streaming script, run as it is), one of the two"
                )
            _known(spec, VERSION_KEYS, f"{where} versions.{version}")
            if "start_timeout" in spec and "script" not in spec:
                raise InvalidInput(
                    f"{where} versions.{version}: start_timeout is the time a script has to start its query; an "
                    "application's build returns its query at once: drop start_timeout"
                )
            if "script" in spec and spec.get("migrate"):
                raise InvalidInput(
                    f"{where} versions.{version}: a script takes no migrate function (a migration gives the state to "
                    "a build application's initial_state): drop migrate, or make the version an application"
                )
            versions[version] = VersionSpec(
                name=version,
                application=_application(base, str(spec["application"])) if "application" in spec else "",
                script=_application(base, str(spec["script"])) if "script" in spec else None,
                conf=_conf(spec.get("conf", {}), base, f"{where} versions.{version}.conf"),
                args=_args(spec.get("args", []), base, f"{where} versions.{version}.args"),
                migrate=_migrate(spec.get("migrate"), f"{where} versions.{version}.migrate"),
                start_timeout=_start_timeout(spec.get("start_timeout"), f"{where} versions.{version}.start_timeout"),
                foreach_batch=_foreach_batch(spec, f"{where} versions.{version}"),
            )
        if not versions:
            raise InvalidInput(f'{where} declares no versions: add e.g. versions.v1 = {{ application = "job.py" }}')
        default_version = str(merged.get("default_version", version_order(versions)[0]))
        delivery = str(merged.get("delivery", "exactly-once"))
        if delivery not in DELIVERY:
            raise InvalidInput(f"{where} delivery {delivery!r} is not one of {', '.join(DELIVERY)}")
        if not merged.get("checkpoint_root"):
            raise InvalidInput(f"{where} needs checkpoint_root (in the job or in [defaults])")
        trigger_interval = merged.get("trigger_interval", "5 seconds")
        duration_seconds(trigger_interval, f"{where} trigger_interval", positive=True)  # the runtime's grammar too
        spec = JobSpec(
            name=name,
            versions=versions,
            default_version=default_version,
            store=_resolve(base, str(merged["store"])) if merged.get("store") else None,
            checkpoint_root=_resolve(base, str(merged["checkpoint_root"])),
            log_dir=_resolve(base, str(merged.get("log_dir", ".runs/logs"))),
            spark_master=str(merged.get("spark_master", "local[2]")),
            deploy_mode=str(merged.get("deploy_mode", "client")),
            trigger_interval=trigger_interval,
            delivery=delivery,
            conf=_conf(merged.get("conf", {}), base, f"{where} conf"),
            args=_args(merged.get("args", []), base, f"{where} args"),
            heartbeat_timeout=_timeout(merged.get("heartbeat_timeout", 30), f"{where} heartbeat_timeout"),
            preflight_timeout=_timeout(merged.get("preflight_timeout", 600), f"{where} preflight_timeout"),
            retention=dict(merged.get("retention", {})),
            description=str(merged.get("description", "")),
            kafka=_kafka(merged.get("kafka"), where),
            desired=_desired(merged.get("desired"), versions, default_version, where),
            restart=_restart(merged.get("restart"), where),
            autoscale=parse_autoscale(merged.get("autoscale"), str(merged.get("spark_master", "local[2]")), where),
            fingerprint=_fingerprint(merged),
        )
        if spec.autoscale is not None and spec.desired is None:
            raise InvalidInput(
                f'{where} autoscale sizes a job the reconcile loop keeps running: add desired = {{ state = "running" }}'
            )
        spec.version(default_version)
        jobs[name] = spec
    return jobs
