"""The job lease, on the moto server and on a local directory, with real processes racing for it: one
winner, the others refused with the holder named; an expired lease of a SIGKILLed holder taken over by
exactly one of two racers; renewal keeps a lease past its ttl; a lease broken, taken over or not renewable
is noticed by its holder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from airflow_plugin.core.errors import IntegrityError, InvalidInput, NotFound, Refused
from airflow_plugin.core.lease import (
    LeaseHeld,
    LeaseLost,
    LeaseRecord,
    acquire,
    break_lease,
    default_holder,
    held_leases,
    lease_key,
    read_lease,
)
from airflow_plugin.core.process import ProcessId
from airflow_plugin.core.storage import Storage, open_storage
from devtools.embedded_s3 import EmbeddedS3
from devtools.faulty_s3 import FaultyS3
from tests.support.processes import ended_process

REPO = Path(__file__).resolve().parent.parent
JOB = "orders"

# A racer: gets everything ready (imports, S3 client, one request), says "ready", waits for "go" on stdin,
# then acquires and prints the outcome as JSON. With "hold" it keeps the lease, never renewing it, until
# its stdin says so (or it is killed).
RACER = r"""
import json, sys
from airflow_plugin.cli.exit_codes import exit_code
from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.lease import acquire
from airflow_plugin.core.storage import open_storage

store, job, holder, ttl, hold = sys.argv[1:6]
storage = open_storage(store)
storage.stat("warm-up")
print("ready", flush=True)
sys.stdin.readline()
try:
    lease = acquire(storage, job, holder, "upgrade", float(ttl))
except SavepointsError as exc:
    print(json.dumps({"won": False, "error": str(exc), "type": type(exc).__name__, "exit_code": exit_code(exc)}))
    sys.exit(0)
print(json.dumps({"won": True}), flush=True)
if hold == "hold":
    sys.stdin.readline()
    lease.release()
"""


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("s3_store"))


def start_racers(store: str, holders: list[str], ttl: float, hold: bool = False) -> list[subprocess.Popen[str]]:
    """Start one process per holder, wait until all are ready, then let them go at once."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, store, JOB, holder, str(ttl), "hold" if hold else "once"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=os.environ.copy(),
        )
        for holder in holders
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    return processes


def outcome(process: subprocess.Popen[str]) -> dict[str, object]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"racer exited with {process.wait()} without an outcome"
    return json.loads(line)


def finish(process: subprocess.Popen[str]) -> None:
    """Tell a holding racer to release, and wait for it."""
    assert process.stdin is not None
    if process.poll() is None:
        process.stdin.write("release\n")
        process.stdin.flush()
    assert process.wait(timeout=60) == 0


def poll(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def check_race(results: list[dict[str, object]], holders: list[str], winner_holder: Callable[[], str]) -> str:
    """Exactly one winner; every loser refused (exit 4) naming the winner. Returns the winner."""
    winners = [holder for holder, result in zip(holders, results, strict=True) if result["won"]]
    assert len(winners) == 1, results
    assert winner_holder() == winners[0]
    for result in results:
        if not result["won"]:
            assert result["type"] == "LeaseHeld" and result["exit_code"] == 4, result
            assert winners[0] in str(result["error"]) and "for upgrade since" in str(result["error"])
            assert f"savepoints lease break {JOB}" in str(result["error"])
    return winners[0]


def test_racing_processes_one_wins_the_others_are_refused(store: str) -> None:
    """Twice: for a job's first lease (no record), then for the released record the first winner left."""
    storage = open_storage(store)
    for _round in ("first lease", "after a release"):
        holders = [f"racer-{i}@test:{i}" for i in range(6)]
        processes = start_racers(store, holders, ttl=60, hold=True)
        try:
            results = [outcome(p) for p in processes]
            winner = check_race(results, holders, lambda: read_lease(storage, JOB).holder)
        finally:
            for process in processes:
                finish(process)
        assert winner and read_lease(storage, JOB) is None  # released
    assert acquire(storage, JOB, "next@test:1", "deploy", ttl=60).record.holder == "next@test:1"


def test_an_expired_lease_of_a_killed_holder_is_taken_over_by_exactly_one(store: str) -> None:
    storage = open_storage(store)
    (dead,) = start_racers(store, ["doomed@test:1"], ttl=1.0, hold=True)
    assert outcome(dead)["won"] is True
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    stale = read_lease(storage, JOB)
    assert stale is not None and stale.holder == "doomed@test:1"
    assert poll(lambda: read_lease(storage, JOB).expired(), timeout=10)

    holders = ["taker-a@test:2", "taker-b@test:3"]
    processes = start_racers(store, holders, ttl=60, hold=True)
    try:
        results = [outcome(p) for p in processes]
        check_race(results, holders, lambda: read_lease(storage, JOB).holder)
        assert read_lease(storage, JOB).token != stale.token
    finally:
        for process in processes:
            finish(process)


def test_a_live_lease_whose_holder_process_of_this_host_is_gone_is_taken_over_at_once(store: str) -> None:
    """A command killed with SIGKILL leaves its lease unexpired: its next run takes it over without waiting out
    the ttl, since a process this one can see (same boot, same PID namespace) that no longer exists acts no more. A
    live process's lease, one of another PID namespace (a container on this host: its pid says nothing here) and
    one named the old way (a host and a pid alone) are still refused until they expire."""
    storage = open_storage(store)
    host = socket.gethostname()
    gone = ended_process()
    here = ProcessId.current()
    other_container = replace(gone, namespace="1")
    for holder in (f"ann@{host}:{here.key}", f"ann@{host}:{other_container.key}", f"ann@{host}:{gone.pid}"):
        acquire(storage, JOB, holder, "apply", ttl=600)
        with pytest.raises(LeaseHeld, match=holder):
            acquire(storage, JOB, "bob@desk:2", "stop", ttl=60)
        break_lease(storage, JOB)
    acquire(storage, JOB, f"ann@elsewhere:{gone.key}", "apply", ttl=600)  # killed: never released; any host name
    with acquire(storage, JOB, "bob@desk:2", "stop", ttl=60) as taken:
        held = read_lease(storage, JOB)
        assert held is not None and held.holder == "bob@desk:2" and held.token == taken.record.token


def test_renewal_keeps_the_lease_past_its_ttl(store: str) -> None:
    storage = open_storage(store)
    ttl = 2.4  # renewed every 0.8 s: slack for a loaded machine
    with acquire(storage, JOB, "renewer@test:1", "upgrade", ttl=ttl) as lease:
        first = read_lease(storage, JOB)
        started = time.monotonic()
        renewals: set[str] = set()

        def renewed_past_ttl() -> bool:
            renewals.add(read_lease(storage, JOB).renewed_at)
            return len(renewals) >= 5  # four renewals: a third of a ttl past it

        assert poll(renewed_past_ttl, timeout=10 * ttl)
        assert time.monotonic() - started > ttl
        current = read_lease(storage, JOB)
        assert current.token == first.token and current.acquired_at == first.acquired_at
        assert not current.expired() and not lease.lost
        (racer,) = start_racers(store, ["late@test:2"], ttl=60)
        result = outcome(racer)
        racer.wait()
        assert result["won"] is False and "renewer@test:1" in str(result["error"])
        lease.check()
    assert read_lease(storage, JOB) is None


def test_a_broken_and_taken_over_lease_is_noticed_and_theirs_is_left_alone(store: str) -> None:
    storage = open_storage(store)
    with pytest.raises(LeaseLost, match="was lost"), acquire(storage, JOB, "old@test:1", "upgrade", ttl=3) as lease:
        broken = break_lease(storage, JOB)
        assert broken is not None and broken.holder == "old@test:1"
        (racer,) = start_racers(store, ["new@test:2"], ttl=60, hold=True)
        assert outcome(racer)["won"] is True
        assert poll(lambda: lease.lost, timeout=5)  # the next renewal notices
        assert "broken or taken over" in (lease.lost_reason or "")
        with pytest.raises(LeaseLost, match="Another operation may be running on orders"):
            lease.check()
    # leaving the block released nothing of the new holder's
    assert read_lease(storage, JOB).holder == "new@test:2"
    finish(racer)
    assert read_lease(storage, JOB) is None


def test_a_lease_that_cannot_be_renewed_is_lost_at_its_expiry(s3_server: EmbeddedS3, s3_store: str) -> None:
    bucket, prefix = s3_store.removeprefix("s3://").split("/", 1)
    with FaultyS3(s3_server.endpoint, faults=["internal_error"]) as proxy:
        storage = proxy.storage(bucket, prefix, max_attempts=2)
        lease = acquire(
            storage, JOB, "cut-off@test:1", "prune", ttl=3.0
        )  # renewals every 1 s: at least one meets the failing store, even on a busy machine
        with pytest.raises(LeaseLost, match=r"not renewed before it expired|could not be renewed"), lease:
            proxy.set_rate(1.0)  # from now on every request fails
            assert poll(lambda: lease.lost, timeout=10)
            assert proxy.counts()["internal_error"] > 0
        proxy.set_rate(0.0)
    assert read_lease(open_storage(s3_store), JOB).holder == "cut-off@test:1"  # left to expire


def test_held_leases_and_their_description(store: str) -> None:
    storage = open_storage(store)
    storage.write("jobs/other/snapshots/x/manifest.json", b"{}")  # not a lease
    first = acquire(storage, "alpha", "alice@host:1", "deploy", ttl=0.5)
    second = acquire(storage, JOB, default_holder(), "restore", ttl=600)
    assert poll(first.record.expired)
    leases = {record.job: record for record in held_leases(storage)}
    assert sorted(leases) == ["alpha", JOB]
    assert leases["alpha"].to_dict()["expired"] is True and leases[JOB].to_dict()["expired"] is False
    text = leases[JOB].describe()
    assert "for restore since" in text and "expires in 9m" in text and f":{os.getpid()}" in text
    with pytest.raises(LeaseHeld, match=r"job orders is busy: .* for restore since"):
        acquire(storage, JOB, "bob@host:2", "stop", ttl=60)
    second.release()
    first.release()  # expired but still ours: removed
    assert held_leases(storage) == []


def test_break_lease_checks_the_holder_and_that_there_is_one(store: str) -> None:
    storage = open_storage(store)
    with pytest.raises(NotFound, match="has no lease"):
        break_lease(storage, JOB)
    acquire(storage, JOB, "alice@host:1", "gc", ttl=60)
    with pytest.raises(Refused, match="held by alice@host:1, not bob"):
        break_lease(storage, JOB, holder="bob@host:2")
    assert read_lease(storage, JOB) is not None
    for garbage in (
        b"garbage",
        b'{"job": "orders"}',
        json.dumps({**asdict(read_lease(storage, JOB)), "expires_at": 5}),
    ):
        storage.write(lease_key(JOB), garbage.encode() if isinstance(garbage, str) else garbage)
        with pytest.raises(IntegrityError, match=r"is not a lease record.*savepoints lease break"):
            acquire(storage, JOB, "bob@host:2", "stop", ttl=60)
    assert break_lease(storage, JOB) is None and read_lease(storage, JOB) is None  # unreadable: broken too


def test_a_release_leaves_the_released_record_which_the_next_holder_takes_in_one_request(store: str) -> None:
    """What a release leaves reads as no lease; the next holder takes it (on S3 in one request, a write naming
    its token, nothing read)."""
    storage = open_storage(store)
    key = lease_key(JOB)
    released = LeaseRecord.released(JOB).to_json()
    first = acquire(storage, JOB, "a@test:1", "deploy", ttl=60)
    first.release()
    assert storage.read(key) == released
    assert read_lease(storage, JOB) is None and held_leases(storage) == []
    with pytest.raises(NotFound, match="was released"):
        break_lease(storage, JOB)

    requests: list[str] = []
    client = getattr(storage, "client", None)
    record = lambda model, **_: requests.append(model.name)  # noqa: E731
    if client is not None:
        client.meta.events.register("before-call.s3", record)
    try:
        with acquire(storage, JOB, "b@test:2", "stop", ttl=60) as second:
            assert second.record.holder == "b@test:2"
    finally:
        if client is not None:
            client.meta.events.unregister("before-call.s3", record)
    if client is not None:
        assert requests == ["PutObject", "PutObject"]  # acquire and release, nothing read
    assert storage.read(key) == released


@pytest.mark.parametrize(
    ("operation", "holder", "ttl", "message"),
    [
        ("upgrade", "", 60, "needs a holder"),
        ("dance", "a@b:1", 60, "unknown lease operation"),
        ("stop", "a@b:1", 0, "must be positive"),
    ],
)
def test_bad_input_writes_nothing(tmp_path: Path, operation: str, holder: str, ttl: float, message: str) -> None:
    storage: Storage = open_storage(str(tmp_path))
    with pytest.raises(InvalidInput, match=message):
        acquire(storage, JOB, holder, operation, ttl)
    assert list(storage.list()) == []
