"""An upgrade as data: a record in the store (`jobs/<job>/upgrades/<id>.json`) holding its mode, its state and
what each step produced, so that whoever advances it next (an Airflow task, `savepoints upgrade --resume`
after a crash) continues from there (the Flink operator's FlinkBlueGreenDeploymentState kept in the resource's
status). Written whole on every change, by compare-and-swap (`Upgrades.put`): a copy read before another process
wrote the record is refused (UpgradeMovedOn), so a phase never goes back; the job's lease, held as
`upgrade:<id>@<driver>` (steps.py `upgrade_holder`), makes one process the one that drives it.

    stop_restore  SAVEPOINTING -> PREFLIGHT -> LAUNCHING (pre-start, STANDBY) -> CUTTING_OVER (stop the old
                  version with a savepoint, start the new one from it) -> CONFIRMING -> DONE
    blue_green    SAVEPOINTING -> PREFLIGHT -> LAUNCHING (green from the live savepoint, staging) -> CATCHING_UP
                  (green's health) -> CUTTING_OVER (T chosen; blue gated at T; green publishes) -> RETIRING
                  (blue writes its last windows up to T, then stops with a savepoint) -> CONFIRMING -> DONE
    replay        as blue_green, but green starts with empty state from earlier source positions (replay.py)
    migrate       as blue_green, with MIGRATING after PREFLIGHT (the version's migration function makes green's
                  initial state from the savepoint's, checked on a throwaway run: migration.py); green starts
                  from the savepoint's positions with that state
    before the cutover: ABORTING -> ABORTED (the old version untouched, the new one and what it staged removed)
    after the cutover:  ROLLING_BACK -> ROLLED_BACK (the old version back from a savepoint, the sink rewound)
    BLOCKED: the pre-flight refused the new version (nothing changed). FAILED: a recovery itself failed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

from .. import layout
from ..errors import Conflict, IntegrityError, NotFound, SavepointsError
from ..storage import Storage
from ..timestamps import stamped_id, utc_now


class Mode(StrEnum):
    BLUE_GREEN = "blue_green"  # the new version beside the old one, an exactly-once cutover: no gap
    STOP_RESTORE = "stop_restore"  # stop the old version with a savepoint, start the new one from it
    REPLAY = "replay"  # the new version beside the old one with empty state, rebuilt from earlier source positions
    MIGRATE = "migrate"  # ... with its initial state made from the old state by the version's migration function

    @property
    def beside(self) -> bool:
        """The new version runs beside the old one and takes over through the gate (no gap)."""
        return self is not Mode.STOP_RESTORE


class Phase(StrEnum):
    SAVEPOINTING = "SAVEPOINTING"
    PREFLIGHT = "PREFLIGHT"
    MIGRATING = "MIGRATING"
    LAUNCHING = "LAUNCHING"
    CATCHING_UP = "CATCHING_UP"
    CUTTING_OVER = "CUTTING_OVER"
    RETIRING = "RETIRING"
    CONFIRMING = "CONFIRMING"
    DONE = "DONE"
    BLOCKED = "BLOCKED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    ROLLING_BACK = "ROLLING_BACK"
    ROLLED_BACK = "ROLLED_BACK"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (Phase.DONE, Phase.BLOCKED, Phase.ABORTED, Phase.ROLLED_BACK, Phase.FAILED)

    @property
    def succeeded(self) -> bool:
        return self is Phase.DONE


# before the cutover a failure aborts (the old version never stopped writing); from it on, it rolls back
BEFORE_CUTOVER = frozenset({Phase.SAVEPOINTING, Phase.PREFLIGHT, Phase.MIGRATING, Phase.LAUNCHING, Phase.CATCHING_UP})


def new_upgrade_id(now: datetime | None = None) -> str:
    return stamped_id("up", now)


class UpgradeMovedOn(Conflict):
    """The upgrade's record changed since this process read it: another process drives the upgrade, and this one
    stops without acting or writing (exit 4)."""


@dataclass
class Upgrade:
    id: str
    job: str
    to_version: str
    requested_mode: str | None = None  # None: the pre-flight's choice
    mode: str | None = None  # decided by the pre-flight
    phase: Phase = Phase.SAVEPOINTING
    created_at: str = field(default_factory=utc_now)
    updated_at: str = field(default_factory=utc_now)
    requested_by: str = ""
    request_id: str | None = None  # the request that made it (an Airflow run): its retries find it
    approved_by: str | None = None  # who approved its launch, when a person was asked (UpgradeJobOperator approve)
    approval_asked_at: str | None = None  # when a person was last asked to approve its launch (run.py await_approval)
    # a rescale (the autoscaler's): the new deployment runs at `size` of the job's knob, the old one ran at
    # `from_size` (what a rollback restores), its state repartitioned to `partitions` when they change
    size: int | None = None
    from_size: int | None = None
    partitions: int | None = None
    # what the steps found and made
    old_deployment: str | None = None
    old_version: str | None = None
    savepoint: str | None = None  # the live savepoint the pre-flight ran on (and green started from)
    preflight: dict[str, Any] | None = None
    modes: dict[str, str] = field(default_factory=dict)  # mode -> why it applies, or why not
    new_deployment: str | None = None
    staging: str | None = None  # blue/green: green's staging table until it publishes
    replay: dict[str, Any] | None = None  # replay: where green starts (replay.py ReplayStart)
    migration: dict[str, Any] | None = None  # migrate: the migration run's report (its initial state, the check)
    cutover_ms: int | None = None  # blue/green: T, epoch ms: windows ending at or before it are the old version's
    cutover_at: str | None = None  # when the cutover happened (blue/green: green published; else the new started)
    stop_savepoint: str | None = None  # the old version's stop-with-savepoint
    rollback_savepoint: str | None = None  # what a rollback restores the old version from
    settings: dict[str, Any] = field(default_factory=dict)  # min_batches, lag_must_fall, limits, allow_renames
    deadline: float | None = None  # epoch seconds: a wait (green catching up) gives up after it
    error: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # [{at, phase, note}]
    # the store's token of the record as this copy read or last wrote it (Upgrades.put compares it); not stored
    token: str | None = field(default=None, compare=False, repr=False)

    def move(self, phase: Phase, note: str = "") -> Upgrade:
        self.phase = phase
        self.updated_at = utc_now()
        self.history.append({"at": self.updated_at, "phase": str(phase), "note": note})
        return self

    @property
    def recovery(self) -> Phase | None:
        """The recovery it was in last (ABORTING or ROLLING_BACK): what a FAILED upgrade failed in."""
        recoveries = (str(Phase.ABORTING), str(Phase.ROLLING_BACK))
        found = next((e["phase"] for e in reversed(self.history) if e["phase"] in recoveries), None)
        return None if found is None else Phase(found)

    @property
    def awaits_approval(self) -> bool:
        """A person was asked to approve its launch and has not: nothing may launch it meanwhile."""
        return self.phase is Phase.LAUNCHING and self.approval_asked_at is not None and self.approved_by is None

    @property
    def cut_over(self) -> bool:
        """Whether the old version gave up the output (a failure from now on rolls back): blue/green once green
        published; stop/restore once the old version stopped."""
        return self.cutover_at is not None or (self.mode == Mode.STOP_RESTORE and self.stop_savepoint is not None)

    def to_dict(self) -> dict[str, Any]:
        data = {**asdict(self), "phase": str(self.phase)}
        del data["token"]  # the store's, not the record's
        return data

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Upgrade:
        try:
            raw = json.loads(data)
            known = {f.name for f in fields(cls)} - {"token"}
            upgrade = cls(**{k: v for k, v in raw.items() if k in known})
            upgrade.phase = Phase(upgrade.phase)
        except (ValueError, TypeError, KeyError) as exc:
            raise IntegrityError(f"upgrade record {where} is corrupt ({exc})") from None
        return upgrade


class Upgrades:
    """Upgrade records of one store."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def put(self, upgrade: Upgrade) -> None:
        """Write the record by compare-and-swap: a new one only if none of its id exists, else only if the store
        still holds what this copy was read as (`upgrade.token`, then the new token). A copy another process wrote
        over meanwhile is refused (UpgradeMovedOn), nothing written: rewritten whole, it would take the upgrade back
        to what this copy saw."""
        key = layout.upgrade_key(upgrade.job, upgrade.id)
        data = upgrade.to_json()
        try:
            if upgrade.token is None:
                upgrade.token = self.storage.create(key, data)
            else:
                upgrade.token = self.storage.replace(key, data, upgrade.token)
        except Conflict:
            raise self._moved_on(upgrade) from None

    def check(self, upgrade: Upgrade) -> None:
        """Refuse (UpgradeMovedOn) a copy whose record changed in the store since it was read or written: what a
        step asks once it holds the upgrade's lease, before it acts on what it read."""
        key = layout.upgrade_key(upgrade.job, upgrade.id)
        try:
            _, token = self.storage.read_with_token(key)
        except FileNotFoundError:
            token = None
        if token is None or token != upgrade.token:
            raise self._moved_on(upgrade)

    def _moved_on(self, upgrade: Upgrade) -> UpgradeMovedOn:
        try:
            now = self.get(upgrade.job, upgrade.id)
        except NotFound:
            return UpgradeMovedOn(f"upgrade {upgrade.id} of job {upgrade.job} is no longer in {self.storage.uri}")
        last = now.history[-1]["note"] if now.history else ""
        return UpgradeMovedOn(
            f"upgrade {upgrade.id} of job {upgrade.job} changed since this process read it: it is {now.phase} now "
            f"({last}; this process's copy: {upgrade.phase}). Another process drives it; this one stops, nothing done. "
            f"See `savepoints upgrade {upgrade.job} --show`"
        )

    def get(self, job: str, upgrade_id: str) -> Upgrade:
        key = layout.upgrade_key(job, upgrade_id)
        try:
            data, token = self.storage.read_with_token(key)
        except FileNotFoundError:
            known = ", ".join(self.ids(job)) or "none yet"
            raise NotFound(f"job {job} has no upgrade {upgrade_id}: its upgrades are {known}") from None
        upgrade = Upgrade.from_json(data, f"{self.storage.uri}/{key}")
        upgrade.token = token
        return upgrade

    def ids(self, job: str) -> list[str]:
        """A job's upgrade ids, oldest first (ids sort by time): one listing, no record read."""
        prefix = layout.upgrades_prefix(job)
        return sorted(
            info.key[len(prefix) : -len(".json")] for info in self.storage.list(prefix) if info.key.endswith(".json")
        )

    def list(self, job: str) -> list[Upgrade]:
        """Every upgrade of a job, oldest first (a record read each)."""
        return [self.get(job, upgrade_id) for upgrade_id in self.ids(job)]

    def newest(self, job: str) -> Upgrade | None:
        """The job's newest upgrade: the only one that may not have ended (begin refuses a second one), so a
        page or a resume reads one record however many upgrades the job had."""
        ids = self.ids(job)
        return self.get(job, ids[-1]) if ids else None

    def gate_refusal(self, job: str, upgrade_id: str | None) -> str | None:
        """Why an upgrade no longer wants its gate and publish requests applied, or None while it cuts over: what
        a driver asks right before it applies one (spark_jobs/runtime/gate.py), so that a request outlives
        neither its upgrade's abort nor its end. An upgrade that cannot be read wants nothing (a declined request
        only makes it abort)."""
        if not upgrade_id:
            return "the request names no upgrade"
        try:
            upgrade = self.get(job, upgrade_id)
        except (SavepointsError, OSError) as exc:
            return f"its upgrade {upgrade_id} cannot be read ({exc})"
        if upgrade.phase is not Phase.CUTTING_OVER:
            return f"upgrade {upgrade_id} is {upgrade.phase}, no longer cutting over"
        return None

    def in_progress(self, job: str) -> Upgrade | None:
        """The job's upgrade that has not ended, if any (there is at most one, and it is the newest)."""
        newest = self.newest(job)
        return newest if newest is not None and not newest.phase.terminal else None
