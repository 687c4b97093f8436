"""The gate of a blue/green upgrade, inside the driver: which rows this deployment writes to its Delta table.

During a blue/green upgrade two versions of a job run at once (docs/architecture.md, "Blue/green upgrades"):
the running one (blue) and the new one (green), restored from a live savepoint of blue under a query id of its
own. Both compute the same windows; each window must reach the table from exactly one of them. The gate splits
them by an output column the job names, the window's end (`StreamingJob(..., gate_column="window_end")`): blue
writes the windows ending at or before a time T, green those ending after it. Until T is chosen green writes
into a staging table of its own; blue accepts T only if it has written nothing ending after T, and green then
publishes, in one Delta commit, what it staged and what its batch emits, of the windows after T. From then on
no window can come from both, and none from neither.

The runtime owns the write for that: a job whose query appends to a Delta table and names its gate column runs
through `foreachBatch` here instead of Spark's Delta sink, appending each batch with Delta's idempotent batch
writes (`txnAppId` = the query id, `txnVersion` = the batch id): what Spark's own Delta sink records, so the
table's exactly-once is the same, and a deployment may switch between the two across a restore.

T is chosen by blue itself, at a batch boundary: the latest window end it has written (plus a margin, if the
upgrade asks for one), and no earlier than the floor the upgrade names (a green that rebuilt its state by replay
holds every window only from the live savepoint's watermark on: the windows up to it are all blue's, already
written by then). So blue never has to decline for having written past a T chosen elsewhere a moment
earlier; the windows of that batch ending after T are left to green, which holds every one of them.

Roles (`status.gate`): `sole` writes every window of its interval (a deployment on its own; an interval
inherited from an upgrade still applies); `staging` is green before the cutover; `blue` writes only windows
ending at or before `until`; `green` only those ending after `after`.

The requests (through the control channel, each naming its upgrade): `gate` and `ungate` to blue, `publish` and
`withdraw` to green. A gate belongs to its upgrade, not to this driver's memory: it is applied only while the
upgrade still wants it (its record is in CUTTING_OVER) and before it expires, and once the upgrade took its
requests back (`ungate`, `withdraw`: an abort) none of its requests is ever applied, whatever order they arrive
in. Requests are decided between two batches: one that arrives during a batch waits for its end (the batch holds
the lock), one that arrives while no batch runs (idle input) is decided at once. A publish needs a batch to
write: it waits for the next one, and is checked again then. The gate as it stands (role, interval, the rows
blue left to green, the upgrades that withdrew) is in the status before any answer, so a later attempt of the
same deployment (a second driver attempt) starts from it (runner.py)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_plugin.core.errors import Conflict
from airflow_plugin.core.records.deployment import BLUE, GREEN, SOLE, STAGING, ControlRequest
from airflow_plugin.core.sinks.delta import is_table
from airflow_plugin.core.storage import Storage, open_storage

from .failpoints import failpoint

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

ACTIONS = ("gate", "ungate", "publish", "withdraw")
WITHDRAWALS = ("ungate", "withdraw")  # an upgrade taking its requests back (an abort)
WRITE_ATTEMPTS = 5  # a Delta append that lost a race with the other version's commit is tried again
# Delta's optimistic concurrency: a commit that lost to a concurrent one (the other version's append, or its
# schema change: v2 may add a column with mergeSchema) is refused with one of these; tried again, it re-reads
LOST_RACE = re.compile(r"io\.delta\.exceptions\.(Concurrent\w*|MetadataChanged|ProtocolChanged)Exception")


def iso(millis: int | None) -> str | None:
    return None if millis is None else datetime.fromtimestamp(millis / 1000, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class GateState:
    """The gate as the status records it (`DeploymentStatus.gate`); times in epoch milliseconds."""

    column: str
    role: str = SOLE
    after: int | None = None  # writes only rows whose column is later than this (green)
    until: int | None = None  # ... and not later than this (blue)
    max_written: int | None = None  # the latest column value this deployment wrote to the live table
    dropped: int = 0  # rows blue left to green (ending after `until`): once any, blue cannot simply go on alone
    staging: str | None = None  # green's staging table, until it publishes
    published_batch: int | None = None
    upgrade: str | None = None  # the upgrade that gated it (blue) or that it published for (green)
    withdrawn: list[str] = field(default_factory=list)  # upgrades that took their requests back: never applied

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "after_at": iso(self.after), "until_at": iso(self.until)}

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> GateState | None:
        """The gate a status recorded (None: not a gated deployment's)."""
        if not data or not data.get("column"):
            return None
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class DeltaTarget:
    """Where and how the job's query appends (read from its writer: sink.py), written here per batch."""

    path: str
    options: dict[str, str] = field(default_factory=dict)


Answer = Callable[[ControlRequest, str], None]  # a request and "accepted" or why it was declined
Wants = Callable[[str | None], str | None]  # why an upgrade no longer wants its requests applied; None: it does
# called right before each Delta write, with what it writes: raises when this driver may no longer commit (its fence)
FenceCheck = Callable[[str], None]


class GatedWriter:
    """The `foreachBatch` function of a gated Delta job. The runner hands it the gate's requests (`handle`);
    it reports the gate after every change (`report`), answers each request (`answer`) and asks the store
    whether a request's upgrade still wants it (`wants`). Right before each Delta write, in its turn at the table
    (`commit_lock`), it calls `fence_check` (the driver's fence), and names itself `holder` (its deployment) in
    the table's commit lock."""

    def __init__(
        self,
        spark: SparkSession,
        target: DeltaTarget,
        gate: GateState,
        checkpoint: str,
        report: Callable[[GateState], None],
        answer: Answer,
        wants: Wants,
        *,
        fence_check: FenceCheck | None = None,
        holder: str | None = None,
    ) -> None:
        self.spark, self.target, self.gate, self.checkpoint = spark, target, gate, checkpoint
        self._report, self._answer, self._wants = report, answer, wants
        self._fence_check = fence_check
        self._holder = holder
        self._publishing: ControlRequest | None = None  # a publish waiting for the next batch
        self._lock = threading.Lock()  # held by a batch from start to end: requests are decided between batches
        self._query_id: str | None = None

    def handle(self, request: ControlRequest) -> None:
        """Decide a request between two batches (at once when none runs); a publish waits for the next batch."""
        with self._lock:
            if request.action == "publish" and self.gate.role == GREEN and self.gate.upgrade == request.upgrade:
                self._settle(request, "accepted")  # seen again by a later attempt of this driver: it published
                return
            if request.action == "publish" and (declined := self._publish_refusal(request)) is None:
                self._publishing = request
                log.info("publish request %s (T %s): at the next batch", request.id, iso(self._t(request)))
                return
            answer = f"declined: {declined}" if request.action == "publish" else self._decide(request)
            self._settle(request, answer)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self._lock:
            self._write_batch(batch, batch_id, self._take_publish())

    def _take_publish(self) -> ControlRequest | None:
        """The publish this batch writes: the waiting one, if its upgrade still wants it (asked now, right before
        the commit it makes); one it no longer wants is declined."""
        publishing, self._publishing = self._publishing, None
        if publishing is not None and (why := self._publish_refusal(publishing) or self._wants(publishing.upgrade)):
            self._settle(publishing, f"declined: {why}")
            return None
        return publishing

    def _write_batch(self, batch: DataFrame, batch_id: int, publishing: ControlRequest | None) -> None:
        from pyspark.sql import functions as F

        column = F.unix_millis(F.col(self.gate.column))
        batch = batch.persist()  # one run of the batch's plan (its state), however often it is read here
        try:
            # the plan runs here, before any write: a batch a table already holds (its txn), which Delta then
            # skips, still writes its state; a restored pending batch the live table took before a crash is safe
            batch.count()
            if publishing is not None:
                self._publish(batch, batch_id, column, publishing)
                failpoint("after-publish-commit")
                self._settle(publishing, "accepted")  # only now: the engine may remove the staging table
            elif self.gate.role == STAGING:
                self._append(batch, str(self.gate.staging), batch_id)
            else:
                if self.gate.until is not None:
                    self.gate.dropped += batch.where(column > self.gate.until).count()
                self._write_live(self._within(batch, column), batch_id, column)
        finally:
            batch.unpersist()
        self._report(self.gate)

    def _settle(self, request: ControlRequest, answer: str) -> None:
        """The gate as it is now in the status (T), then the answer the engine waits for."""
        log.info("%s request %s of upgrade %s: %s", request.action, request.id, request.upgrade, answer)
        self._report(self.gate)
        self._answer(request, answer)

    def _decide(self, request: ControlRequest) -> str:
        """Apply or decline a gate, ungate or withdraw request now. A gate names no T but a margin: T is chosen
        here, from what this deployment has written (nothing after T, by construction), plus the margin; the
        status then holds it (`until`)."""
        gate, upgrade = self.gate, request.upgrade
        if request.action == "gate":
            if (declined := self._gate_refusal(request)) is not None:
                return f"declined: {declined}"
            if gate.role != BLUE:  # a request seen again (a later attempt of this driver) keeps its T
                values = request.gate or {}
                floor = int(values.get("floor", 0))  # a green that did not start from this state holds no earlier
                t = max(gate.max_written or 0, gate.after or 0, floor) + int(values.get("margin", 0))
                gate.role, gate.until, gate.upgrade, gate.dropped = BLUE, t, upgrade, 0
            return "accepted"
        self._withdraw(upgrade)
        if request.action == "ungate":
            if gate.role == BLUE and gate.upgrade == upgrade:
                if gate.dropped:
                    left = f"{gate.dropped} rows ending after {iso(gate.until)}"
                    return f"declined: it already left {left} to the new version"
                gate.role, gate.until, gate.upgrade = SOLE, None, None
            return "accepted"
        pending = self._publishing  # withdraw: the publish is fenced, whether or not it arrived yet
        if pending is not None and pending.upgrade == upgrade:
            self._publishing = None
            self._settle(pending, "declined: withdrawn by its upgrade")
        if gate.role == GREEN and gate.upgrade == upgrade:
            after = iso(gate.after)
            return f"declined: it published at batch {gate.published_batch} (it writes the windows after {after})"
        return "accepted"

    def _gate_refusal(self, request: ControlRequest) -> str | None:
        gate = self.gate
        if request.upgrade in gate.withdrawn:
            return f"upgrade {request.upgrade} took its requests back"
        if gate.role == BLUE:
            return None if gate.upgrade == request.upgrade else f"it is gated by upgrade {gate.upgrade}"
        if request.expires_at is not None and time.time() > request.expires_at:
            return f"it expired at {iso(int(request.expires_at * 1000))} before a batch boundary took it"
        if gate.role == STAGING:
            return "it is staging, not writing the live table"
        return self._wants(request.upgrade)

    def _publish_refusal(self, request: ControlRequest) -> str | None:
        if request.upgrade in self.gate.withdrawn:
            return f"upgrade {request.upgrade} took its requests back"
        if self.gate.role != STAGING:
            return f"it is {self.gate.role}, not staging"
        return None

    def _withdraw(self, upgrade: str | None) -> None:
        if upgrade and upgrade not in self.gate.withdrawn:
            self.gate.withdrawn.append(upgrade)

    @staticmethod
    def _t(request: ControlRequest) -> int:
        return int((request.gate or {}).get("t", 0))

    def _within(self, rows: DataFrame, column: Column) -> DataFrame:
        if self.gate.after is not None:
            rows = rows.where(column > self.gate.after)
        if self.gate.until is not None:
            rows = rows.where(column <= self.gate.until)
        return rows

    def _write_live(self, rows: DataFrame, batch_id: int, column: Column) -> None:
        from pyspark.sql import functions as F

        latest = rows.agg(F.max(column)).collect()[0][0]
        self._append(rows, self.target.path, batch_id)
        if latest is not None:
            self.gate.max_written = max(int(latest), self.gate.max_written or int(latest))

    def _publish(self, batch: DataFrame, batch_id: int, column: Column, request: ControlRequest) -> None:
        """Green's cutover, one Delta commit: the windows after T that it staged, and those of this batch."""
        t = self._t(request)
        self.gate.role, self.gate.after, self.gate.until, self.gate.upgrade = GREEN, t, None, request.upgrade
        rows = batch
        if is_table(open_storage(str(self.gate.staging))):  # it staged at least one batch
            staged = self.spark.read.format("delta").load(str(self.gate.staging))
            rows = staged.unionByName(batch, allowMissingColumns=True)
        self._write_live(self._within(rows, column), batch_id, column)
        self.gate.published_batch, self.gate.staging = batch_id, None
        log.info("published at batch %d: windows ending after %s come from this deployment", batch_id, iso(t))

    def _append(self, rows: DataFrame, path: str, batch_id: int) -> None:
        """Append with Delta's idempotent batch write, in this driver's turn at the table; a commit that lost a race
        with the other version's, or whose turn ended before it did, is tried again (Delta skips it if it got in
        after all)."""
        writer = rows.write.format("delta").mode("append").options(**self.target.options)
        writer = writer.option("txnAppId", self.query_id).option("txnVersion", batch_id)
        # two drivers write the live table only while one is blue and the other green (an upgrade's cutover)
        shared = path == self.target.path and self.gate.role in (BLUE, GREEN)
        holder = self._holder or f"query {self.query_id}"
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                failpoint("before-commit-turn")  # a test lines the two drivers up here: both commit at once
                with commit_lock(path, holder=holder, shared=shared) as turn:
                    turn.check()  # still this driver's turn, right before the write
                    if self._fence_check is not None:
                        self._fence_check(f"batch {batch_id} to {path}")
                    writer.save(path)
                if turn.lost is None:
                    return
                why = f"its turn at the table ended before the commit did ({turn.lost})"
            except CommitTurnLost as exc:
                why = str(exc)
            except Exception as exc:  # Delta's concurrent-modification errors come through py4j
                if not LOST_RACE.search(str(exc)[:2000]) or attempt == WRITE_ATTEMPTS:
                    raise
                why = f"the Delta commit lost a race ({str(exc)[:200]})"
            if attempt == WRITE_ATTEMPTS:
                raise CommitTurnLost(f"batch {batch_id} to {path}: {why}, {attempt} times")
            log.warning("batch %d to %s: %s; trying again", batch_id, path, why)
            time.sleep(0.2 * attempt)

    @property
    def query_id(self) -> str:
        """The query's id as its checkpoint records it: what Spark's own Delta sink uses as the txn appId."""
        if self._query_id is None:
            self._query_id = str(json.loads(open_storage(self.checkpoint).read("metadata"))["id"])
        return self._query_id


COMMIT_LOCK = "_savepoints_commit.lock"  # beside a table's log ("_": neither Delta nor VACUUM reads it)
LOCK_TTL = 60.0  # seconds a turn lasts unless renewed; its holder renews it every third of that while it commits
LOCK_WAIT = 900.0  # the longest a commit waits for the other driver's turn to end; then its batch fails
POLL = (0.05, 1.0)  # a waiting driver looks at the lock this often, at first and at most
STORE_LOCKED = ("s3", "s3a")  # Delta's LogStore there (S3SingleDriverLogStore) excludes writers within one JVM only


class CommitTurnLost(Exception):
    """This driver's turn at a table ended before its write did (its lock was taken over, or not renewed lately)."""


class CommitLockHeld(Exception):
    """The other driver held the table's commit lock, renewing it, for longer than a commit waits (`LOCK_WAIT`)."""


class Turn:
    """A driver's turn at a table, as `commit_lock` yields it: `check()` right before the write raises when the turn
    is over; `lost`, once it ended, says why another driver may have committed during it (None: none could)."""

    lost: str | None = None

    def check(self) -> None:
        """Nothing to check where the turn needs no lock object (a local flock, one writer, HDFS)."""


@contextmanager
def commit_lock(
    table: str, *, holder: str = "", shared: bool = True, ttl: float = LOCK_TTL, wait: float = LOCK_WAIT
) -> Iterator[Turn]:
    """A turn at the Delta table `table`: Delta needs a store where only one writer can create a log version (its
    storage docs' "mutual exclusion"). The two drivers of a blue/green upgrade (also replay, migrate) commit to one
    table from two JVMs, and both could write one version, the second over the first (seen: a checksum error on the
    log, and a commit gone).

    - a local table (both drivers on one host): Hadoop checks that the version is absent, then renames onto it, which
      excludes writers within one JVM only; the drivers take turns through an exclusive lock of a file beside the log,
      which the kernel drops with a driver that dies;
    - S3: Delta's default LogStore checks, then PUTs, likewise within one JVM only; while `shared` (two drivers may
      write the table), they take turns through a lock object beside the log (`StoreLock`), made of S3's conditional
      writes; the upgrade's mode (core/upgrades/mode.py) refuses two writers where the pre-flight found none;
    - HDFS renames atomically, never over a file: Delta's own put-if-absent holds across JVMs, no lock."""
    scheme = urlsplit(table).scheme.lower()
    if scheme in ("", "file"):
        with _file_lock(Path(urlsplit(table).path if scheme else table)):
            yield Turn()
        return
    if scheme not in STORE_LOCKED or not shared:
        yield Turn()
        return
    who = holder or f"{socket.gethostname()}:{os.getpid()}"
    lock = StoreLock(open_storage(table), who, ttl=ttl, wait=wait).acquire()
    try:
        yield lock
    finally:
        lock.release()


@contextmanager
def _file_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / COMMIT_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class StoreLock(Turn):
    """A turn at a table in a store whose own writes exclude other JVMs from nothing (S3): the object
    `<table>/_savepoints_commit.lock`, holding its holder, a token of its own and an expiry.

    Taken by a conditional create (If-None-Match: *); renewed every third of its ttl by a thread while the commit runs
    (a conditional replace of the version it wrote last); released by a conditional delete of that version. A driver
    that finds it held waits, and takes over a lock whose holder stopped renewing it by a conditional replace of the
    version it found: of two takers one wins. Whether the holder stopped is judged on the taker's clock alone: it takes
    over once the lock stayed unchanged for the holder's ttl while it watched, so no two hosts' clocks need agree. The
    holder counts its turn from before the write that made or renewed it, so its turn ends before any taker's begins;
    `check` before its write refuses a turn not renewed for half the ttl, or no longer the lock's version (one
    conditional GET)."""

    def __init__(self, storage: Storage, holder: str, *, ttl: float = LOCK_TTL, wait: float = LOCK_WAIT) -> None:
        self.storage, self.holder, self.ttl, self.wait = storage, holder, ttl, wait
        self.token = secrets.token_hex(8)  # the content of each of its writes is its own (storage/base.py)
        self.lost = None
        self._version = ""  # the lock's version (ETag) this driver wrote last
        self._until = 0.0  # this driver's turn ends then (time.monotonic), unless renewed
        self._renewals = 0
        self._guard = threading.Lock()  # the renewal thread and the writer's check
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def uri(self) -> str:
        return f"{self.storage.uri}/{COMMIT_LOCK}"

    def acquire(self) -> StoreLock:
        deadline = time.monotonic() + self.wait
        watched: tuple[str, float] | None = None  # the version found, and since when it has not changed (this clock)
        pause = POLL[0]
        while True:
            sent = time.monotonic()
            try:
                return self._hold(self.storage.create(COMMIT_LOCK, self._record()), sent)
            except Conflict:
                pass
            try:
                found, version = self.storage.read_with_token(COMMIT_LOCK)
            except FileNotFoundError:
                continue  # released in between: create it
            now = time.monotonic()
            if watched is None or watched[0] != version:
                watched = (version, now)  # taken or renewed meanwhile: watched afresh
            elif now - watched[1] >= _ttl(found, self.ttl):
                try:
                    taken = self.storage.replace(COMMIT_LOCK, self._record(), version)
                except Conflict:
                    watched = None  # another taker won, or its holder renewed it after all
                    continue
                log.warning("took over %s from %s: not renewed for %.0fs", self.uri, _describe(found), now - watched[1])
                return self._hold(taken, now)
            if now > deadline:
                raise CommitLockHeld(f"{self.uri} was held for more than {self.wait:.0f}s by {_describe(found)}")
            time.sleep(pause)
            pause = min(pause * 1.5, POLL[1])

    def check(self) -> None:
        with self._guard:
            if self.lost is None:
                try:
                    changed = self.storage.read_if_changed(COMMIT_LOCK, self._version)
                except FileNotFoundError:
                    changed = (b"", "")
                if changed is not None:
                    self.lost = f"{self.uri} was taken over: it is now {_describe(changed[0])}"
            if self.lost is None and (left := self._until - time.monotonic()) < self.ttl / 2:
                # not renewed lately (the store out of reach, this process paused): a taker may come any moment
                raise CommitTurnLost(f"{self.uri} was last renewed {self.ttl - left:.0f}s ago")
        if self.lost is not None:
            raise CommitTurnLost(f"this driver's turn is over: {self.lost}")

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        try:
            if not self.storage.delete_if(COMMIT_LOCK, self._version):
                self.lost = self.lost or f"{self.uri} was removed by someone else"
        except Conflict:
            self.lost = self.lost or self._taken_over()
        except Exception as exc:  # the commit is in; the lock expires by itself (the other driver waits that long)
            log.warning("could not release %s (it expires in %.0fs): %s", self.uri, self.ttl, exc)

    def _hold(self, version: str, since: float) -> StoreLock:
        self._version, self._until = version, since + self.ttl
        self._renewer = threading.Thread(target=self._renew, name="commit-lock-renewal", daemon=True)
        self._renewer.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            with self._guard:
                if self.lost is not None:
                    return
                self._renewals += 1
                sent = time.monotonic()
                try:
                    self._version = self.storage.replace(COMMIT_LOCK, self._record(), self._version)
                    self._until = sent + self.ttl
                except Conflict:
                    self.lost = self._taken_over()
                    return
                except Exception as exc:  # the store out of reach: the turn runs out unless a later renewal gets in
                    log.warning("could not renew %s: %s", self.uri, exc)

    def _taken_over(self) -> str:
        try:
            now = _describe(self.storage.read(COMMIT_LOCK))
        except FileNotFoundError:
            now = "gone"
        except Exception as exc:  # only to say who took it
            now = f"unknown ({exc})"
        return f"{self.uri} was taken over: it is now {now}"

    def _record(self) -> bytes:
        expires = int((time.time() + self.ttl) * 1000)  # for people: takers judge by their own clock (above)
        record = {"holder": self.holder, "host": socket.gethostname(), "pid": os.getpid(), "token": self.token}
        record |= {"renewal": self._renewals, "ttl_seconds": self.ttl, "expires_at": iso(expires)}
        return json.dumps(record).encode()


def _ttl(record: bytes, default: float) -> float:
    """The ttl the lock's holder promised to renew within (a record that does not say: ours)."""
    try:
        return float(json.loads(record)["ttl_seconds"])
    except (ValueError, KeyError, TypeError):
        return default


def _describe(record: bytes) -> str:
    try:
        held = json.loads(record)
        where = f"{held['host']}:{held['pid']}"
        return f"{held['holder']} ({where}, renewal {held['renewal']}, expires {held['expires_at']})"
    except (ValueError, KeyError, TypeError):
        return "an unreadable record" if record else "nothing (removed)"
