"""The source guard: before anything is restored, the broker is asked whether it still holds every record the
restored query would read next (sources/kafka.py). Every restore path goes through `plan_restore`, which
calls `guard`: the CLI's restore, deploy (also from latest-savepoint or latest-state), the upgrade's
cutover, the rollback and the pre-flight. So a snapshot whose offsets expired is refused BEFORE the old
version is stopped or anything is written, never left to Spark to fail (or skip) after the cutover.

    no Kafka source                           nothing to check
    every record still held                   restore
    records gone (expired, gone, ...)         refused (exit 4): which partitions, how many records, which
                                              newer snapshots are restorable; or accepted explicitly, and then
                                              the gap is recorded in the snapshot's history (and by deploy in
                                              the new deployment's record)
    no broker known, or it does not answer    refused, unless the gap is accepted (restored unchecked)

`assess` is the same check for many snapshots at once (one broker query): `savepoints list`, the savepoints
page and the retention plan mark the snapshots that can no longer be restored, with the records lost."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import BrokerUnavailable, SourceGap
from ..sources import SourcePosition
from ..sources.kafka import Broker, KafkaSettings, SourceCheck, compare, kafka_positions, topics_of, unchecked
from ..timestamps import utc_now

log = logging.getLogger(__name__)

ACCEPT_FLAG = "--accept-source-gap"
GAP_EVENT = "restored-with-source-gap"
_NO_BROKER = (
    "no Kafka broker is known for job {job}: declare it in the jobs file (kafka = {{ bootstrap_servers = ... }}), "
    "set $SAVEPOINTS_KAFKA_BOOTSTRAP or pass --kafka-bootstrap"
)


class Positioned(Protocol):
    """Where a snapshot's sources stood: a manifest has it, and so has its catalog entry."""

    id: str
    offsets_version: int
    source_offsets: list[str]


class Snapshot(Positioned, Protocol):
    """A snapshot as the guard names it in a refusal: a manifest, or its catalog entry."""

    job: str
    kind: Any
    batch_id: int | None


def kafka_of(manifest: Positioned) -> list[SourcePosition]:
    return kafka_positions(manifest.offsets_version, manifest.source_offsets)


def assess(manifests: Iterable[Positioned], kafka: KafkaSettings | None) -> dict[str, SourceCheck]:
    """Snapshot id -> its check, for the snapshots with Kafka sources, from ONE broker query. Never raises: a
    broker that is unknown or does not answer makes every check `unchecked`, with the reason."""
    positions = {m.id: kafka_of(m) for m in manifests}
    positions = {snapshot: p for snapshot, p in positions.items() if p}
    if not positions:
        return {}
    if kafka is None:
        return {snapshot: unchecked("no Kafka broker known") for snapshot in positions}
    try:
        held = Broker(kafka).watermarks(set().union(*(topics_of(p) for p in positions.values())))
    except BrokerUnavailable as exc:
        log.warning("%s", exc)
        return {snapshot: unchecked(str(exc), kafka.bootstrap_servers) for snapshot in positions}
    return {snapshot: compare(p, held, kafka.bootstrap_servers) for snapshot, p in positions.items()}


@dataclass(frozen=True)
class Guarded:
    """What the guard found for one restore: the check (None: no Kafka source), and whether a gap was accepted."""

    check: SourceCheck | None
    accepted_gap: bool = False
    at: str = field(default_factory=utc_now)  # when the broker was asked

    def gap(self, target: str) -> dict[str, Any] | None:
        """The record of an accepted gap (the snapshot's history, the deployment's record); None if none."""
        if not self.accepted_gap or self.check is None:
            return None
        return {
            "at": self.at,
            "event": GAP_EVENT,
            "target": target,
            "checked": self.check.checked,
            "records_lost": self.check.records_lost,
            "lost_unknown": self.check.lost_unknown,
            "summary": self.check.summary(),
            "partitions": [p.describe() for p in self.check.problems],
        }

    def warnings(self) -> list[str]:
        if not self.accepted_gap or self.check is None:
            return []
        return [f"Kafka source gap accepted: {self.check.summary()}; it is recorded with the snapshot"]


def guard(
    manifest: Snapshot,
    kafka: KafkaSettings | None,
    *,
    accept_gap: bool,
    newer: Callable[[], Sequence[Snapshot]],
) -> Guarded:
    """Check a snapshot's Kafka positions before it is restored; raise SourceGap unless every record is still held
    or the gap is accepted. `newer`: the job's completed snapshots taken after it, oldest first, which a refusal
    offers instead when the broker still serves them (asked only then)."""
    positions = kafka_of(manifest)
    if not positions:
        return Guarded(None)
    topics = ", ".join(sorted(topics_of(positions)))
    if kafka is None:
        check = unchecked(_NO_BROKER.format(job=manifest.job))
    else:
        try:
            check = Broker(kafka).check(positions)
        except BrokerUnavailable as exc:
            if not accept_gap:
                raise
            check = unchecked(str(exc), kafka.bootstrap_servers)
    if check.restorable:
        return Guarded(check)
    if accept_gap:
        log.warning("snapshot %s of job %s restored with a source gap: %s", manifest.id, manifest.job, check.summary())
        return Guarded(check, accepted_gap=True)
    if not check.checked:
        raise SourceGap(
            f"snapshot {manifest.id} of job {manifest.job} reads Kafka topics {topics}, whose offsets cannot be "
            f"checked: {check.note}. Or pass {ACCEPT_FLAG} to restore unchecked; nothing was written"
        )
    raise SourceGap(
        f"snapshot {manifest.id} of job {manifest.job} cannot be restored without losing records: Kafka no longer "
        f"holds what the query would read next ({check.summary()}): "
        + "; ".join(p.describe() for p in check.problems)
        + f". {_alternatives(newer(), kafka)} Or pass {ACCEPT_FLAG} (accept_source_gap in Airflow) to "
        "restore anyway: the gap is recorded with the snapshot and the new deployment. Nothing was written"
    )


def _alternatives(newer: Sequence[Snapshot], kafka: KafkaSettings | None) -> str:
    """The newer snapshots that the broker can still serve, newest first."""
    checks = assess(newer, kafka)
    fine = [m for m in reversed(newer) if m.id not in checks or checks[m.id].restorable]
    if not fine:
        return (
            "No newer snapshot of the job is restorable either: deploy without state (--restore none) to start "
            "from the source's starting offsets."
        )
    shown = ", ".join(f"{m.id} ({m.kind}, batch {m.batch_id})" for m in fine[:3])
    return f"Restore a newer snapshot instead: {shown}."
