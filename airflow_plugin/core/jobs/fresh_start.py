"""A start with no state (a fresh deploy, or a pre-started driver activated without a snapshot) onto the sink an
earlier deployment wrote. A fresh query starts at batch 0: the file sink would skip every batch it already
holds (their records lost), a Delta table would take the same records again under the new query's id
(duplicates): guards/sink.py. So such a start is refused before anything is launched, or, asked to
(`--rewind-sink`), the sink is moved back first: the file sink's output aside into its quarantine, a Delta
table RESTOREd to before its first streaming write.

Which sink: the one the newest deployment of the same build (application and arguments) reported; its
runtime records the sink before its query starts. A sink no deployment of that build has reported yet is
the runtime's to check (spark_jobs/runtime/sink.py), just before the query starts."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from ..errors import Refused
from ..guards.sink import FRESH, FRESH_START, Rewind, ahead, plan_fresh_rewind, rewind_of_fresh_start
from ..sinks import GUARDED, SinkRef, from_description
from ..storage import Storage
from .context import JobContext
from .spec import VersionSpec

log = logging.getLogger(__name__)


def build_of(ctx: JobContext, version: VersionSpec) -> list[str]:
    """What a deployment of `version` runs: its application or script and the arguments from the jobs file."""
    return [version.code, *ctx.spec.args, *version.args]


def code_digest(version: VersionSpec) -> str | None:
    """The SHA-256 of the version's code file, where it is a file here (None: on a cluster's storage, or missing)."""
    path = Path(version.code)
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sink_of_build(ctx: JobContext, build: list[str]) -> SinkRef | None:
    """The sink the newest deployment of the same build reported (its runtime records it before its query
    starts): the sink a fresh start of that build will write."""
    for deployment in reversed(ctx.deployments.list(ctx.name)):
        if deployment.build != build:
            continue
        status = ctx.deployments.status(ctx.name, deployment.id)
        sink = from_description(status.sink if status else None)
        if sink is not None and sink.kind in GUARDED:
            return sink
    return None


def fresh_start(ctx: JobContext, build: list[str], deployment_id: str, rewind: bool) -> list[tuple[Storage, Rewind]]:
    """A fresh start onto the sink an earlier deployment of the same build wrote: refused before anything is
    launched when that sink holds batches (guards/sink.py), or rewound with `rewind`. A sink no deployment of
    this build reported yet is checked by the runtime, just before its query starts."""
    sink = _sink_of_build(ctx, build)
    if sink is None:
        return []
    storage = ctx.open(sink.location)
    found = ahead(sink, storage, FRESH)
    if found is None:
        return []
    if not rewind:
        raise Refused(found.refusal(FRESH_START, False, rewind_of_fresh_start(sink, storage)))
    planned = plan_fresh_rewind(sink, storage, f"fresh-{deployment_id}", ctx.spark_access())
    log.warning("fresh start of %s onto %s: rewinding it (%s)", ctx.name, sink.location, planned.describe())
    return [(storage, planned)]
