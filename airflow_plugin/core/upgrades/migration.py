"""A migration's run: the version's migration function (jobs file `migrate = "package.module:function"`) turns the
live savepoint's state into the new version's initial state, and the result is checked before anything changes.

In one Spark application of the new version, on throwaway locations (the runtime's `--migration`, spark_jobs/
runtime): the savepoint restored into `old/`, its state read with Spark's state data source at its batch and
handed to the function; what the function returns written to `initial_state` (Parquet, kept until the upgrade
ends: green reads it); then the new version's own query run for its first batch on a fresh `check/` checkpoint
seeded at the savepoint's positions with that initial state, its state read back and compared with what the
function returned. The run's status reports the comparison; a failure names the function and the column or key.
The running deployment is never touched; `old/` and `check/` are deleted afterwards."""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..jobs.context import JobContext
from ..records.deployment import State
from ..records.manifest import Manifest
from ..snapshots.restore import execute_restore, plan_restore
from ..sources import offsets_by_source
from .preflight import run_throwaway

log = logging.getLogger(__name__)

MIGRATION_FAILED = "MIGRATION_FAILED"


@dataclass
class MigrationReport:
    function: str
    snapshot: str
    batch_id: int | None
    passed: bool = False
    reason: str = ""
    error_class: str | None = None
    initial_state: str | None = None  # where the checked initial state is (green's `--initial-state`)
    seed: dict[str, Any] = field(default_factory=dict)  # green's `--seed`: the savepoint's positions and watermark
    result: dict[str, Any] | None = None  # the run's own report (rows, state variables compared, mismatches)
    seconds: float = 0.0
    log: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def seed_of(manifest: Manifest) -> dict[str, Any]:
    """Start exactly where the savepoint's state stands: its batch's end positions, its watermark."""
    offsets = list(offsets_by_source(manifest.offsets_version, manifest.source_offsets).values())
    return {"offsets": offsets, "watermark_ms": int(manifest.watermark_ms or 0)}


def run_migration(
    ctx: JobContext,
    manifest: Manifest,
    version: str,
    function: str,
    initial_state: str,
    *,
    timeout: float | None = None,
) -> MigrationReport:
    """Run the migration of `manifest`'s state for `version` into `initial_state` and check it (see the module's
    doc). Returns the report; `passed` False says why in `reason`."""
    job = ctx.spec
    spec_version = job.launchable(version)
    report = MigrationReport(function, manifest.id, manifest.batch_id, seed=seed_of(manifest))
    started = time.monotonic()
    run_id = f"mg-{manifest.id.split('-', 1)[1]}-{secrets.token_hex(2)}"
    root = f"{job.checkpoint_root.rstrip('/')}/{job.name}/_migrations/{run_id}"
    old_uri, check_uri = f"{root}/old", f"{root}/check"
    old, check = ctx.open(old_uri), ctx.open(check_uri)
    try:
        plan = plan_restore(ctx.store, manifest.job, manifest.id, old, check_sinks=False, check_sources=False)
        execute_restore(ctx.store, plan)
        payload = {
            "function": function,
            "state": old_uri,
            "batch_id": manifest.batch_id,
            "output": initial_state,
            "seed": report.seed,
        }
        conf = {**job.conf, **spec_version.conf}  # the new version's own: its query starts fresh
        log.info("migration of %s to %s by %s, from snapshot %s", job.name, version, function, manifest.id)
        args = ("--migration", json.dumps(payload, separators=(",", ":")))
        run = run_throwaway(ctx, spec_version, run_id, check_uri, conf, args, what="migration", timeout=timeout)
        report.log = run.log
        report.result = run.status.migration if run.status else None
        if run.state is not State.STOPPED:
            report.error_class = run.error_class or MIGRATION_FAILED
            report.reason = f"the migration by {function} failed: {run.first_line}"
            return report
        report.passed, report.initial_state = True, initial_state
        result = report.result or {}
        report.reason = (
            f"{function} made {result.get('rows', '?')} rows of initial state from snapshot {manifest.id} (batch "
            f"{manifest.batch_id}); version {spec_version.name} took them in and its state read back equal "
            f"({', '.join(result.get('compared') or []) or 'no state variable named'})"
        )
        return report
    finally:
        report.seconds = round(time.monotonic() - started, 3)
        for location in (old, check):
            location.delete([info.key for info in location.list("")])
