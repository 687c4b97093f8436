"""A job lease in the store (Flink's Kubernetes operator style): one operation at a time per job.

jobs/<job>/lease.json = {job, holder, operation, acquired_at, renewed_at, expires_at, ttl_s, token}

`acquire` creates the record only if it is absent (Storage.create). A record whose `expires_at` has passed belongs
to a holder that stopped renewing (crashed, killed), and one whose holder is a process of this boot and PID
namespace that no longer exists (`holder_gone`: a pid means nothing elsewhere) acts no more: either is taken over
only if it is still the record that was read (Storage.replace with its token), so of two takers exactly one wins. A
live record refuses with the holder, the operation and their age. `token` is a random id of one acquisition,
unchanged by renewals: every held record's content is unique to its writer, which the store relies on (base.py). The
released record is the one shared content: a retried release that finds it has released.

`Lease` is a context manager: a background thread renews every ttl/3 (a replace with the current token, so a lease
broken or taken over by someone else is noticed at the next renewal), and the lease is released at the end:
replaced, only if unchanged, by the job's released record (`LeaseRecord.released`: one content per job, expired,
holder "(released)"). Readers see no lease in it. The next `acquire` takes it in one request where the store derives
a token from the content (S3: its MD5 ETag), a replace naming the released record's token without reading it.

A lost lease sets `lost`; `check()` raises LeaseLost, and so does leaving the block. Expiry compares the holder's
clock (expires_at) with the reader's: keep ttl well above the clock skew between hosts.

Pure engine code: no airflow, no pyspark."""

from __future__ import annotations

import getpass
import json
import logging
import os
import secrets
import socket
import threading
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

from .errors import Conflict, IntegrityError, InvalidInput, NotFound, Refused
from .layout import JOBS, is_valid_name, lease_key
from .parallel import run_parallel
from .process import Liveness, ProcessId
from .storage import Storage

log = logging.getLogger(__name__)

OPERATIONS = ("deploy", "stop", "kill", "upgrade", "rollback", "rescale", "restore", "prune", "gc", "apply")
DEFAULT_TTL = 60.0  # seconds
RELEASED = "released"  # the token of a released record: never one of an acquisition (those are hex)
_EPOCH = "1970-01-01T00:00:00.000Z"


class LeaseHeld(Refused):
    """Another holder has the job's lease: nothing was done (exit 4)."""


class LeaseLost(Refused):
    """This holder's lease was broken or taken over (or could not be renewed in time): the operation must
    stop, another may be running on the same job (exit 4)."""


def default_holder() -> str:
    """user@host:<process> of this process, its process named as `ProcessId.key` (pid, boot, PID namespace, start
    time): the host name is for people, the rest tells whether the holder still runs (`holder_gone`)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (containers)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}:{ProcessId.current().key}"


def holder_gone(holder: str) -> bool:
    """Whether `holder` (as `default_holder` names one) is a process of this boot and PID namespace that no longer
    exists, so what it left behind is orphaned. False for anything else: a process this one cannot see (another
    machine, another container on this host, whatever its host name), an Airflow run, a live process."""
    process = ProcessId.parse(holder.rpartition(":")[2])
    return process is not None and process.look() is Liveness.GONE


def airflow_holder(dag_id: str, run_id: str) -> str:
    """The holder name of an Airflow DAG run (the Airflow layer passes its context here): its tasks continue
    one operation (an upgrade's steps), a retried task takes its own lease back at once."""
    return f"airflow:{dag_id}/{run_id}"


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _age(seconds: float) -> str:
    whole = int(max(0.0, seconds))
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


@dataclass(frozen=True)
class LeaseRecord:
    job: str
    holder: str
    operation: str
    acquired_at: str
    renewed_at: str
    expires_at: str
    ttl_s: float
    token: str  # a random id of this acquisition; renewals keep it

    @classmethod
    def new(cls, job: str, holder: str, operation: str, ttl: float, now: datetime) -> LeaseRecord:
        return cls(
            job=job,
            holder=holder,
            operation=operation,
            acquired_at=_stamp(now),
            renewed_at=_stamp(now),
            expires_at=_stamp(now + timedelta(seconds=ttl)),
            ttl_s=ttl,
            token=secrets.token_hex(16),
        )

    @classmethod
    def released(cls, job: str) -> LeaseRecord:
        """What a release leaves: the same content for every release of the job (its token is known without a
        read), a well-formed record that has always expired."""
        return cls(job, f"({RELEASED})", RELEASED, _EPOCH, _EPOCH, _EPOCH, 0.0, RELEASED)

    @property
    def is_released(self) -> bool:
        return self.token == RELEASED

    def renewed(self, now: datetime) -> LeaseRecord:
        return replace(self, renewed_at=_stamp(now), expires_at=_stamp(now + timedelta(seconds=self.ttl_s)))

    def expired(self, now: datetime | None = None) -> bool:
        return (now or _now()) >= _parse(self.expires_at)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> LeaseRecord:
        try:
            record = cls(**json.loads(data))
            for stamp in (record.acquired_at, record.renewed_at, record.expires_at):
                _parse(stamp)
        except (ValueError, TypeError, AttributeError) as exc:
            raise IntegrityError(
                f"{where} is not a lease record ({exc}): if no operation is running, remove it with "
                "`savepoints lease break <job>`"
            ) from None
        return record

    def describe(self, now: datetime | None = None) -> str:
        now = now or _now()
        held = (now - _parse(self.acquired_at)).total_seconds()
        renewed = (now - _parse(self.renewed_at)).total_seconds()
        left = (_parse(self.expires_at) - now).total_seconds()
        state = f"expired {_age(-left)} ago" if left <= 0 else f"expires in {_age(left)}"
        return f"{self.holder} for {self.operation} since {_age(held)} (renewed {_age(renewed)} ago, {state})"

    def to_dict(self, now: datetime | None = None) -> dict[str, Any]:
        now = now or _now()
        return {
            **asdict(self),
            "age_s": round((now - _parse(self.acquired_at)).total_seconds(), 3),
            "expired": self.expired(now),
        }


class Lease:
    """A held lease. Use as a context manager (renewal thread, release at the end), or call `renew` and
    `release` yourself."""

    def __init__(self, storage: Storage, record: LeaseRecord, token: str) -> None:
        self.storage = storage
        self.key = lease_key(record.job)
        self.record = record
        self._token = token  # the store's token of our current record
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost_reason: str | None = None
        self.kept = False  # left in the store at the end, for the next step of the same holder

    @property
    def job(self) -> str:
        return self.record.job

    @property
    def lost(self) -> bool:
        """Whether the lease was broken or taken over, or its last renewal has expired (then another holder
        may take it over any moment, even before the renewal thread notices)."""
        if self.lost_reason is None and self.record.expired():
            self._lose(f"it was not renewed before it expired at {self.record.expires_at}")
        return self.lost_reason is not None

    def check(self) -> None:
        """Raise LeaseLost if the lease was lost: call between the steps of a long operation."""
        if self.lost:
            raise LeaseLost(
                f"the lease of job {self.job} for {self.record.operation} by {self.record.holder} was lost: "
                f"{self.lost_reason}. Another operation may be running on {self.job}: check "
                f"`savepoints status` before retrying"
            )

    def _lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
            log.error("lease of job %s lost: %s", self.job, reason)

    def renew(self) -> None:
        """Extend the lease by its ttl, only if the store still holds our record. Marks it lost when it was
        broken or taken over, or when the store stayed unreachable until it expired."""
        with self._lock:
            if self.lost:
                return
            record = self.record.renewed(_now())
            try:
                self._token = self.storage.replace(self.key, record.to_json(), self._token)
                self.record = record
            except Conflict:
                self._lose(f"{self.storage.uri}/{self.key} was broken or taken over by someone else")
            except Exception as exc:  # the store unreachable for now: the next renewal tries again
                log.warning("could not renew the lease of job %s (will retry): %s", self.job, exc)
                if self.record.expired():
                    self._lose(f"it could not be renewed before it expired at {self.record.expires_at}: {exc}")

    def release(self) -> None:
        """Replace our record by the job's released one if the store still holds ours (never someone else's)."""
        self._stop_renewing()
        with self._lock:
            try:
                self.storage.replace(self.key, LeaseRecord.released(self.job).to_json(), self._token)
            except Conflict:
                self._lose(
                    f"{self.storage.uri}/{self.key} was broken or taken over by someone else; theirs was left alone"
                )

    def keep(self) -> None:
        """Stop renewing but leave the record in the store: an operation of several steps in several
        processes (an Airflow DAG run) holds the job until its last step releases it, or until the lease
        expires if that step never comes."""
        self._stop_renewing()
        self.kept = True

    def _renew_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.renew()

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Lease:
        interval = self.record.ttl_s / 3
        self._thread = threading.Thread(
            target=self._renew_every, args=(interval,), name=f"lease-{self.job}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.kept:
            self.check()
            return
        try:
            self.release()
        except Exception as error:  # the store unreachable: the lease expires by itself
            log.warning(
                "could not release the lease of job %s (it expires at %s): %s", self.job, self.record.expires_at, error
            )
        if exc_type is None:
            self.check()  # the operation finished, but maybe not alone: say so


def acquire(storage: Storage, job: str, holder: str, operation: str, ttl: float = DEFAULT_TTL) -> Lease:
    """Take the job's lease, or take over an expired one, or one of the same holder (the next step of an
    operation of several steps, or a retry of a step whose process died); LeaseHeld (exit 4) when someone
    else holds it."""
    if operation not in OPERATIONS:
        raise InvalidInput(f"unknown lease operation {operation!r}: use one of {', '.join(OPERATIONS)}")
    if not holder:
        raise InvalidInput("a lease needs a holder name (user@host:pid, or the Airflow task)")
    if not ttl > 0:
        raise InvalidInput(f"lease ttl must be positive seconds, not {ttl}")
    key = lease_key(job)
    released = storage.token_of(LeaseRecord.released(job).to_json())
    if released is not None:  # the usual case, a lease released by this savepoints: one request
        record = LeaseRecord.new(job, holder, operation, ttl, _now())
        try:
            return Lease(storage, record, storage.replace(key, record.to_json(), released))
        except Conflict:
            pass  # held, absent, or a token the store does not derive from the content (SSE-KMS): read it
    # The lease may be released between our failed create and our read: then create once more.
    for _ in range(2):
        record = LeaseRecord.new(job, holder, operation, ttl, _now())
        try:
            return Lease(storage, record, storage.create(key, record.to_json()))
        except Conflict:
            pass
        try:
            data, token = storage.read_with_token(key)
        except FileNotFoundError:
            continue
        current = LeaseRecord.from_json(data, f"{storage.uri}/{key}")
        orphaned = holder_gone(current.holder)  # its process (one this one can see) is gone: it acts no more
        if not current.expired() and current.holder != holder and not orphaned:
            raise _held(storage, job, current)
        record = LeaseRecord.new(job, holder, operation, ttl, _now())
        try:
            token = storage.replace(key, record.to_json(), token)
            lease = Lease(storage, record, token)
        except Conflict:
            raise _held(storage, job, _read(storage, job), took_over=not current.is_released) from None
        if current.holder == holder:  # a later step of the same holder (an Airflow DAG run's next task, a retry)
            log.info("lease of job %s: %s continues (%s)", job, holder, operation)
        elif not current.is_released:
            why = "expired" if current.expired() else "its holder's process is gone"
            log.warning("took over the lease of job %s (%s) from %s", job, why, current.describe())
        return lease
    raise LeaseHeld(
        f"the lease of job {job} in {storage.uri} keeps changing hands: another operation is starting on it; "
        "wait for it, see `savepoints status`"
    )


def _held(storage: Storage, job: str, current: LeaseRecord | None, *, took_over: bool = False) -> LeaseHeld:
    if current is None:
        return LeaseHeld(
            f"the lease of job {job} in {storage.uri} was just taken and released by someone else: try again"
        )
    verb = "took over the expired lease first" if took_over else "holds the lease"
    return LeaseHeld(
        f"job {job} is busy: {current.describe()} {verb} in {storage.uri}. Wait for it to finish; if that "
        f"holder is surely dead, `savepoints lease break {job}`"
    )


def _read(storage: Storage, job: str) -> LeaseRecord | None:
    key = lease_key(job)
    try:
        record = LeaseRecord.from_json(storage.read(key), f"{storage.uri}/{key}")
    except FileNotFoundError:
        return None
    return None if record.is_released else record


def read_lease(storage: Storage, job: str) -> LeaseRecord | None:
    """The job's lease record (expired or not), or None (none, or released)."""
    return _read(storage, job)


def held_leases(storage: Storage) -> list[LeaseRecord]:
    """Every job's lease record in the store, expired ones included (see `expired()`), by job: the job names
    from one delimited listing, then each job's lease (never a listing of every key under jobs/)."""
    names = [name for name in storage.children(JOBS) if is_valid_name(name)]
    found = run_parallel(lambda name: _read(storage, name), names)
    return sorted((record for record in found if record is not None), key=lambda r: r.job)


def release_lease(storage: Storage, job: str, holder: str) -> LeaseRecord | None:
    """Release the job's lease that `holder` kept (`Lease.keep`) from another process: the released record
    in its place, as `Lease.release` leaves, only if it is still the record that was read. Returns the
    released record; None when `holder` holds none (released, expired and taken, or broken meanwhile)."""
    key = lease_key(job)
    try:
        data, token = storage.read_with_token(key)
    except FileNotFoundError:
        return None
    current = LeaseRecord.from_json(data, f"{storage.uri}/{key}")
    if current.is_released or current.holder != holder:
        return None
    try:
        storage.replace(key, LeaseRecord.released(job).to_json(), token)
    except Conflict:
        return None
    return current


def break_lease(storage: Storage, job: str, *, holder: str | None = None) -> LeaseRecord | None:
    """Remove the job's lease whoever holds it (for a holder that is surely dead), only if it is still the
    record that was read: a holder that renews meanwhile is alive, and its lease stays. `holder`, when
    given, must match. Returns the removed record (None if it was unreadable)."""
    key = lease_key(job)
    try:
        data, token = storage.read_with_token(key)
    except FileNotFoundError:
        raise NotFound(f"job {job} has no lease in {storage.uri}: nothing to break") from None
    try:
        current = LeaseRecord.from_json(data, f"{storage.uri}/{key}")
    except IntegrityError:
        current = None  # unreadable: breaking it is what the error message recommends
    if current is not None and current.is_released:
        raise NotFound(f"job {job} has no lease in {storage.uri} (the last one was released): nothing to break")
    if holder is not None and (current is None or current.holder != holder):
        found = current.holder if current else "an unreadable record"
        raise Refused(f"the lease of job {job} is held by {found}, not {holder}: nothing was broken")
    try:
        removed = storage.delete_if(key, token)
    except Conflict:
        raise Refused(
            f"the lease of job {job} changed while it was being broken (its holder renewed it, so it is alive, "
            "or someone else took it): nothing was broken; see `savepoints status`"
        ) from None
    if not removed:
        raise NotFound(f"job {job} has no lease in {storage.uri} any more: nothing to break")
    log.warning("broke the lease of job %s: %s", job, current.describe() if current else "an unreadable record")
    return current
