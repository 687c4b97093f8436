"""Pre-flight of an upgrade: will the new version of a job run on this snapshot's state?

Spark checks state compatibility only on the first batch it PLANS after a restart (docs/spark-checkpoints.md
section 7), and its check ignores field names: grouping by `country` instead of `user` (both strings)
passes and silently reads the old state under the new key. So, against throwaway copies, in a separate
Spark application of the new version with a `noop` sink:

    spark-check    the snapshot restored, `commits/N` removed: Spark re-plans batch N with the stored
                   state schemas and fails on an incompatible key, value or operator
    schema-probe   the same, with the stored state schemas removed (for transformWithState also the
                   operator metadata's references to them): Spark writes the new version's schemas,
                   whose field names are compared with the snapshot's

Nothing of the running deployment is touched; the copies are deleted afterwards.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import BrokerUnavailable, Conflict, Refused, SourceGap
from ..guards import source as source_guard
from ..jobs.context import JobContext
from ..jobs.deploy import submit_spec
from ..jobs.launcher import exit_code, force_kill, launch, log_tail
from ..jobs.spec import VersionSpec
from ..records.deployment import DeploymentStatus, State
from ..records.manifest import Manifest
from ..snapshots.restore import execute_restore, plan_restore
from ..sources.kafka import Broker
from ..sources.subscription import topic_changes
from ..storage import Storage
from .mode import CONDITIONAL_WRITES, lock_store

log = logging.getLogger(__name__)

# Stored state schemas. Formats v1/v2: one file per state store, its key and value schema as JSON.
_SCHEMA_FILE = re.compile(r"^state/.+/_metadata/schema$")
# transformWithState (format v3): a file per run, `<batch>_<uuid>`, with a key and a value schema per state
# variable; the operator metadata `_metadata/v2/<batch>` references them by absolute path.
_SCHEMA_V3_FILE = re.compile(r"^(state/\d+/_stateSchema/[^/]+)/(\d+)_[^/]+$")
_OPERATOR_METADATA_V2 = re.compile(r"^(state/\d+/_metadata/v2)/(\d+)$")
_SCHEMA_PATHS = re.compile(r'"stateSchemaFilePaths":\[[^\]]*\]')
_STRUCT = '{"type":"struct"'
# Spark's errors for a state file a committed batch needs that is not there
_MISSING_STATE = re.compile(
    r"CANNOT_READ_STREAMING_STATE_FILE|CANNOT_READ_DELTA_FILE_NOT_EXISTS|CANNOT_READ_SNAPSHOT_FILE_NOT_EXISTS|"
    r"CANNOT_LOAD_STATE_STORE.*does not exist",
    re.DOTALL,
)


# Spark's errors for a new version whose state is not the old one's (a key, a value, an operator changed): an
# upgrade that must rebuild the state (replay) or convert it (migrate), not one that cannot run at all
STATE_INCOMPATIBLE = frozenset(
    {
        "STATE_STORE_COLUMN_FAMILY_SCHEMA_INCOMPATIBLE",
        "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
        "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
        "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
        "STATE_STORE_VALUE_SCHEMA_EVOLUTION_THRESHOLD_EXCEEDED",
        "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY",
        "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
    }
)


class UpgradeBlocked(Refused):
    """The pre-flight found that the new version cannot take over this state."""


def schema_field_names(data: bytes) -> list[list[str]]:
    """The field names (nested ones dotted) of each struct schema in a stored schema file: key schema,
    then value schema. The file frames its JSON documents with binary lengths; the JSON is found as is."""
    text = data.decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    schemas = []
    start = text.find(_STRUCT)
    while start != -1:
        try:
            schema, end = decoder.raw_decode(text, start)
        except ValueError:
            end = start + len(_STRUCT)
        else:
            schemas.append(_names(schema))
        start = text.find(_STRUCT, end)
    return schemas


def _names(struct: dict[str, Any], prefix: str = "") -> list[str]:
    names = []
    for item in struct.get("fields", []):
        name = f"{prefix}{item.get('name')}"
        names.append(name)
        kind = item.get("type")
        if isinstance(kind, dict) and kind.get("type") == "struct":
            names += _names(kind, f"{name}.")
    return names


def _key_value_pairs(schemas: list[list[str]]) -> list[list[list[str]]]:
    """[key fields, value fields] per state variable, in a stable order (Spark's order of the state
    variables in a transformWithState schema file is not part of the schema)."""
    return sorted([list(pair) for pair in zip(schemas[0::2], schemas[1::2], strict=False)])


@dataclass(frozen=True)
class SchemaRename:
    # relative to the checkpoint: state/0/0/_metadata/schema, or a transformWithState store's
    # state/0/_stateSchema/default
    schema_file: str
    stored: list[list[str]]  # [key fields, value fields] in the snapshot (one pair per state variable)
    new: list[list[str]]  # the same as the new version writes them

    def describe(self) -> str:
        pairs = len(self.stored) > 2
        parts = []
        for index, (old, new) in enumerate(zip(self.stored, self.new, strict=False)):
            if old != new:
                what = ("key", "value")[index % 2] + (f" of state variable {index // 2 + 1}" if pairs else "")
                parts.append(f"{what} ({', '.join(old)}) -> ({', '.join(new)})")
        if len(self.stored) != len(self.new):
            parts.append(f"{len(self.stored) // 2} state variable(s) -> {len(self.new) // 2}")
        return f"{self.schema_file}: {'; '.join(parts)}"


@dataclass
class PreflightReport:
    job: str
    version: str
    snapshot: str
    batch_id: int | None
    passed: bool = False
    reason: str = ""
    error_class: str | None = None
    renames: list[SchemaRename] = field(default_factory=list)
    renames_allowed: bool = False
    schemas_compared: int = 0
    seconds: float = 0.0
    log: str | None = None
    sources: dict[str, Any] | None = None  # the snapshot's Kafka positions against the broker (source_guard)
    topic_changes: list[dict[str, Any]] = field(default_factory=list)  # the new version's subscription vs them
    accepted_source_gap: bool = False
    # what the new version writes, as its runtime read it from the query (its status): the sink as Spark names
    # it, and its gate (the gate column) or why its writes cannot be gated (`not_gated`): an upgrade's mode
    sink: str | None = None
    gate: dict[str, Any] | None = None
    # the new version's state cannot take over the snapshot's (Spark's check, or renamed fields): a replay or a
    # migration may still (core/upgrades/mode.py); and what the version declares for a replay (its state_horizon)
    state_incompatible: bool = False
    replay: dict[str, Any] | None = None
    query_shape: dict[str, Any] | None = None  # its watermarks and stateful operators (DeploymentStatus.query_shape)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "renames": [r.describe() for r in self.renames]}

    def raise_if_blocked(self) -> None:
        if (blocked := self.blocked()) is not None:
            raise blocked

    def blocked(self) -> UpgradeBlocked | None:
        if not self.passed:
            return UpgradeBlocked(
                f"upgrade of job {self.job} to version {self.version} is blocked by the pre-flight on snapshot "
                f"{self.snapshot} (batch {self.batch_id}): {self.reason.rstrip('.')}. The running deployment was "
                "not touched"
            )
        return None


def _state_keys(location: Storage) -> list[str]:
    return [info.key for info in location.list("state/")]


def _stored_schemas(location: Storage, state_keys: list[str]) -> dict[str, bytes]:
    """The current schema of each state store: formats v1/v2 by file; for a transformWithState store
    (keyed by its `_stateSchema/<store>` directory) the newest of its files."""
    newest: dict[str, tuple[int, str]] = {}
    for key in state_keys:
        if _SCHEMA_FILE.match(key):
            newest[key] = (0, key)
        elif match := _SCHEMA_V3_FILE.match(key):
            newest[match[1]] = max(newest.get(match[1], (-1, "")), (int(match[2]), key))
    return {schema: location.read(key) for schema, (_, key) in newest.items()}


def _drop_schemas(location: Storage, state_keys: list[str]) -> None:
    """Remove the stored state schemas so that Spark writes the new version's. transformWithState's
    operator metadata references its schema files: Spark would read the removed files, so the
    references go too (with none, Spark writes the new version's schema and runs on)."""
    doomed: list[str] = []
    for key in state_keys:
        if _SCHEMA_FILE.match(key):
            doomed += [key, key.rsplit("/", 1)[0] + "/.schema.crc"]
        elif "/_stateSchema/" in key:
            doomed.append(key)
        elif match := _OPERATOR_METADATA_V2.match(key):
            text = location.read(key).decode("utf-8")
            location.write(key, _SCHEMA_PATHS.sub('"stateSchemaFilePaths":[]', text).encode("utf-8"))
            doomed.append(f"{match[1]}/.{match[2]}.crc")  # stale now
    location.delete(doomed)


def _prepare(ctx: JobContext, manifest: Manifest, location: Storage, *, drop_schemas: bool) -> dict[str, bytes]:
    """Restore the snapshot into a scratch location and remove `commits/N` so that batch N is re-planned;
    for the schema probe also remove the stored schemas. Returns the stored schemas."""
    # noop sink; the sources were checked once, before the copies (preflight)
    plan = plan_restore(ctx.store, manifest.job, manifest.id, location, check_sinks=False, check_sources=False)
    execute_restore(ctx.store, plan)
    location.delete([f"commits/{manifest.batch_id}", f"commits/.{manifest.batch_id}.crc"])
    state_keys = _state_keys(location)
    schemas = _stored_schemas(location, state_keys)
    if drop_schemas:
        _drop_schemas(location, state_keys)
    return schemas


@dataclass(frozen=True)
class ThrowawayRun:
    """How a run of a job version on a throwaway checkpoint ended (the pre-flight's, a migration's): its final
    status, and for a failure its error class and first line."""

    state: State
    status: DeploymentStatus | None
    log: str
    error_class: str | None = None
    detail: str = ""

    @property
    def first_line(self) -> str:
        first = (self.detail.strip().splitlines() or ["(no output)"])[0].rstrip(".")
        return first if first.startswith(f"[{self.error_class}]") else f"[{self.error_class}] {first}"


def run_throwaway(
    ctx: JobContext,
    version: VersionSpec,
    run_id: str,
    checkpoint: str,
    conf: dict[str, str],
    runtime_args: tuple[str, ...],
    *,
    what: str,
    timeout: float | None = None,
) -> ThrowawayRun:
    """Run `version` under the runtime with `runtime_args` (`--preflight ...`, `--migration ...`) on `checkpoint`
    until it ends (STOPPED or FAILED in its status), killed after `timeout` (default: the job's
    preflight_timeout); its status is removed afterwards."""
    job = ctx.spec
    timeout = job.preflight_timeout if timeout is None else timeout
    spec = submit_spec(ctx, version, run_id, checkpoint, conf, runtime_args, lasting=False)
    spec = replace(spec, name=f"{job.name}-{version.name}-{what}")
    log_path = Path(job.log_dir) / job.name / f"{run_id}.log"
    handle = launch(spec, log_path, ctx.command_builder)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = ctx.deployments.status(job.name, run_id)
            if status is not None and status.state in (State.STOPPED, State.FAILED):
                break
            if exit_code(handle) is not None:
                status = ctx.deployments.status(job.name, run_id)
                break
            time.sleep(0.25)
        else:
            force_kill(handle)
            raise Refused(
                f"the {what} of job {job.name} did not finish within {timeout:.0f}s (log {log_path}); it was killed. "
                "The running deployment was not touched. If the log shows it still working (a state of many "
                f"partitions on a slow store takes minutes), raise preflight_timeout of job {job.name} in the jobs "
                "file"
            )
        if status is not None and status.state is State.STOPPED:
            return ThrowawayRun(State.STOPPED, status, str(log_path))
        error_class = (status.error_class if status else None) or f"{what.upper().replace('-', '_')}_FAILED"
        detail = (status.error_message if status else None) or log_tail(handle)
        return ThrowawayRun(State.FAILED, status, str(log_path), error_class, detail)
    finally:
        ctx.deployments.remove(job.name, run_id)


def preflight(
    ctx: JobContext,
    snapshot_id: str,
    version: str,
    *,
    allow_renames: bool = False,
    timeout: float | None = None,
    accept_source_gap: bool = False,
    running: DeploymentStatus | None = None,
) -> PreflightReport:
    """Run the pre-flight and return its report (`raise_if_blocked()` turns a block into an error). Before
    Spark runs, the snapshot's Kafka positions are checked against the broker (as every restore does); after
    it ran, the topics the new version subscribes to are compared with them. `running`: the status of the
    deployment whose own build (its application and arguments) the new one runs at another size (a rescale):
    its code already runs on this state, so no Spark application is started; what it writes is what that
    deployment's runtime reports."""
    job = ctx.spec
    spec_version = job.launchable(version)
    manifest = ctx.store.get(job.name, snapshot_id)
    report = PreflightReport(job.name, spec_version.name, manifest.id, manifest.batch_id, renames_allowed=allow_renames)
    report.accepted_source_gap = accept_source_gap
    try:
        guarded = source_guard.guard(
            manifest,
            ctx.kafka,
            accept_gap=accept_source_gap,
            newer=partial(ctx.store.newer_completed, manifest.job, manifest.id),
        )
    except (SourceGap, BrokerUnavailable) as exc:
        report.reason = str(exc).removesuffix(". Nothing was written").removesuffix("; nothing was written")
        return report
    report.sources = guarded.check.to_dict() if guarded.check else None
    if running is not None:
        _writes(ctx, report, running)
        report.passed = True
        report.reason = (
            f"a rescale of the build that runs on this state (batch {manifest.batch_id}): no Spark pre-flight; "
            "its writes as its runtime reports them"
        )
        return report
    started = time.monotonic()
    run_id = f"pf-{manifest.id.split('-', 1)[1]}-{secrets.token_hex(2)}"
    root = f"{job.checkpoint_root.rstrip('/')}/{job.name}/_preflight/{run_id}"
    check_uri, probe_uri = f"{root}/spark-check", f"{root}/schema-probe"
    spark_check, probe = ctx.open(check_uri), ctx.open(probe_uri)
    try:
        stored = _prepare(ctx, manifest, spark_check, drop_schemas=False)
        _prepare(ctx, manifest, probe, drop_schemas=True)
        conf = {**job.conf, **spec_version.conf, **manifest.spark_conf, **manifest.restore_conf}
        log.info("pre-flight of %s %s on snapshot %s (batch %s)", job.name, version, manifest.id, manifest.batch_id)
        args = ("--preflight", probe_uri)
        run = run_throwaway(ctx, spec_version, run_id, check_uri, conf, args, what="preflight", timeout=timeout)
        report.log, status = run.log, run.status
        if status is not None:
            _writes(ctx, report, status)
        if run.state is not State.STOPPED:
            report.error_class = run.error_class
            report.reason = incomplete_state(manifest, str(run.error_class), run.detail, run.first_line)
            report.reason = report.reason or f"Spark refused the state: {run.first_line}"
            report.state_incompatible = report.error_class in STATE_INCOMPATIBLE
            return report
        compare_schemas(report, stored, _stored_schemas(probe, _state_keys(probe)))
        if guarded.check is not None and ctx.kafka is not None and status is not None:
            changes = topic_changes(source_guard.kafka_of(manifest), status.sources, Broker(ctx.kafka))
            report.topic_changes = [c.to_dict() for c in changes]
            if any(c.problem for c in changes) and not accept_source_gap:
                report.reason = (
                    "the new version reads other Kafka topics than the snapshot: "
                    + "; ".join(c.describe() for c in changes if c.problem)
                    + f". Keep the subscription, or accept the gap explicitly ({source_guard.ACCEPT_FLAG})"
                )
                return report
        if report.renames and not allow_renames:
            report.state_incompatible = True
            report.reason = (
                "the new version's state schema renames fields that Spark's own check ignores (the old state "
                f"would be read under the new names): {'; '.join(r.describe() for r in report.renames)}. If the "
                "state really means the same, allow renames explicitly (allow_renames / --allow-renames)"
            )
            return report
        report.passed = True
        report.reason = f"batch {manifest.batch_id} re-planned and run by version {spec_version.name}; " + (
            f"{report.schemas_compared} state schema(s) compared"
            + (f", renames allowed: {len(report.renames)}" if report.renames else ", field names unchanged")
        )
        return report
    finally:
        report.seconds = round(time.monotonic() - started, 3)
        for location in (spark_check, probe):
            location.delete([info.key for info in location.list("")])


def _writes(ctx: JobContext, report: PreflightReport, status: DeploymentStatus) -> None:
    """What the new version writes, as a runtime of it reported it: its sink, gate, replay horizon and query shape;
    for a gated sink with a commit lock, whether the lock's store honours conditional writes."""
    report.sink, report.gate, report.replay = status.sink, status.gate, status.replay
    report.query_shape = status.query_shape
    if report.gate and report.gate.get("column") and (table := lock_store(report.sink)) is not None:
        report.gate = {**report.gate, CONDITIONAL_WRITES: conditional_writes(ctx.open(table))}


PROBE = "_savepoints_commit.probe"  # beside the drivers' commit lock (gate.py COMMIT_LOCK), removed at once


def conditional_writes(table: Storage) -> bool | str:
    """Whether a table's storage honours the conditional writes its drivers' commit lock is made of during an
    upgrade (spark_jobs/runtime/gate.py `StoreLock`): True, or what it did instead. Tried on a key of its own."""
    key = f"{PROBE}-{secrets.token_hex(4)}"
    other = '"00000000000000000000000000000000"'  # a version the key never has
    attempts = (
        ("a create of a key that exists (If-None-Match)", lambda: table.create(key, b"second")),
        ("a replace naming another version (If-Match)", lambda: table.replace(key, b"third", other)),
        ("a delete naming another version (If-Match)", lambda: table.delete_if(key, other)),
    )
    try:
        token = table.create(key, secrets.token_hex(16).encode())
        for what, attempt in attempts:
            try:
                attempt()
            except Conflict:
                continue
            return f"{table.uri} took {what} as if it were unconditional"
        table.delete_if(key, token)
        return True
    except Exception as exc:  # an error answer (not implemented, access denied): nothing to build a lock on
        return f"trying them on {table.uri} failed ({exc})"
    finally:
        try:
            table.delete([key])
        except Exception as exc:
            log.warning("could not remove %s/%s: %s", table.uri, key, exc)


def incomplete_state(manifest: Manifest, error_class: str, detail: str, first_line: str) -> str | None:
    """Spark's error when state files the snapshot's commits promise are missing, as what it means: the
    snapshot's state is incomplete (a sink that skipped batches leaves such checkpoints). None otherwise."""
    if not _MISSING_STATE.search(f"{error_class} {detail}"):
        return None
    return (
        f"the state of snapshot {manifest.id} is incomplete: its commits reach batch {manifest.batch_id}, but "
        f"state files Spark needs to load it do not exist ({first_line}). A sink that skipped batches as already "
        "written leaves exactly this: the query committed those batches without running them, so their state "
        "was never written. Restore a snapshot taken before the skipping began, or deploy fresh with "
        "--rewind-sink (docs/operations.md, 'A sink that skips batches')"
    )


def compare_schemas(report: PreflightReport, stored: dict[str, bytes], new: dict[str, bytes]) -> None:
    """Record in `report` each stored schema whose field names the new version's differ from."""
    for key, data in sorted(stored.items()):
        if key not in new:
            log.warning("pre-flight: the new version wrote no schema %s; its names were not compared", key)
            continue
        report.schemas_compared += 1
        old_names, new_names = schema_field_names(data), schema_field_names(new[key])
        if _key_value_pairs(old_names) != _key_value_pairs(new_names):
            report.renames.append(SchemaRename(key, old_names, new_names))
