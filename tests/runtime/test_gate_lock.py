"""The two drivers of an upgrade take turns at committing to a Delta table on S3 (spark_jobs/runtime/gate.py
`commit_lock`, `StoreLock`): Delta's default S3 LogStore checks that a log version is absent and then PUTs it, which
excludes other writers within one JVM only. Here plain processes stand in for the drivers, on the embedded S3: one
waits while the other holds the table's lock object, and goes on once it is released, or once its holder died and the
lock expired; a holder paused past its ttl finds its turn over. And the pre-flight's try of the table's conditional
writes, which the upgrade's mode needs before it runs two drivers at once (core/upgrades/mode.py `commit_problem`).
The drivers themselves, committing one table at once: test_gate_commits.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from itertools import pairwise
from pathlib import Path

import pytest

from airflow_plugin.core.storage import S3Storage, open_storage
from airflow_plugin.core.upgrades.preflight import conditional_writes
from devtools.embedded_s3 import EmbeddedS3
from spark_jobs.runtime.failpoints import ENV as FAILPOINTS
from spark_jobs.runtime.gate import COMMIT_LOCK, CommitTurnLost, commit_lock

pytestmark = pytest.mark.slow(seconds=60)  # processes and a ttl of seconds: about a minute in all

REPO = Path(__file__).resolve().parents[2]
TTL = 3.0  # seconds: renewed every second while held

# A driver's turn: it holds the table's lock until a line on stdin, then checks it is still its turn (as a driver
# does right before its write) and releases it.
TURN = """
import sys
from spark_jobs.runtime.gate import commit_lock
with commit_lock(sys.argv[1], holder=sys.argv[2], ttl=float(sys.argv[3])) as turn:
    print("held", flush=True)
    sys.stdin.readline()
    try:
        turn.check()
        print("checked: still its turn", flush=True)
    except Exception as exc:
        print(f"checked: {type(exc).__name__}: {exc}", flush=True)
print(f"released; lost: {turn.lost}", flush=True)
"""


@pytest.fixture
def table(s3_server: EmbeddedS3) -> str:
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return f"s3a://{bucket}/output"


def turn(table: str, holder: str) -> subprocess.Popen[str]:
    """A process that takes a turn at the table (its environment has the embedded S3's endpoint: conftest)."""
    return subprocess.Popen(
        [sys.executable, "-c", TURN, table, holder, str(TTL)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip


def line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


@pytest.mark.timeout(120)
def test_the_drivers_of_an_s3_table_take_turns_through_its_lock_object(table: str) -> None:
    for ending in ("release", "die"):
        blue = turn(table, "blue")
        assert line(blue) == "held"
        green = turn(table, "green")
        assert green.stdout is not None
        with pytest.raises(subprocess.TimeoutExpired):
            # longer than the ttl: blue keeps it by renewing it; a wrong lock would let green through here
            green.wait(timeout=TTL + 2)
        held = json.loads(open_storage(table).read(COMMIT_LOCK))
        assert held["holder"] == "blue" and held["renewal"] >= 2 and held["ttl_seconds"] == TTL, held
        if ending == "release":
            said = blue.communicate("\n", timeout=30)[0]
            assert "checked: still its turn" in said and "lost: None" in said, said
            assert line(green) == "held"
        else:
            blue.kill()
            blue.wait()
            died = time.monotonic()
            assert line(green) == "held"
            # taken over once the lock stayed unchanged for its ttl: at least 2/3 of it after blue's last renewal
            assert time.monotonic() - died >= TTL * 2 / 3 - 0.5
        said = green.communicate("\n", timeout=30)[0]
        assert "checked: still its turn" in said and "lost: None" in said, said
        assert open_storage(table).stat(COMMIT_LOCK) is None, "released by a conditional delete"


@pytest.mark.timeout(120)
def test_a_holder_paused_past_its_ttl_finds_its_turn_over(table: str) -> None:
    """Paused (SIGSTOP) while it holds the lock: the other driver takes it over; continued, the paused one's check
    right before its write refuses, and its release says why its turn ended (a batch written again)."""
    blue = turn(table, "blue")
    assert line(blue) == "held"
    blue.send_signal(signal.SIGSTOP)
    try:
        green = turn(table, "green")
        assert line(green) == "held"  # after blue's lock expired
    finally:
        blue.send_signal(signal.SIGCONT)
    said = blue.communicate("\n", timeout=30)[0]
    assert "checked: CommitTurnLost" in said and "green" in said, said
    assert "lost: s3://" in said and "was taken over: it is now green" in said, said
    assert json.loads(open_storage(table).read(COMMIT_LOCK))["holder"] == "green", "blue's release left it alone"
    said = green.communicate("\n", timeout=30)[0]
    assert "checked: still its turn" in said and "lost: None" in said, said


def test_of_two_takers_of_an_expired_lock_one_wins_and_turns_never_overlap(table: str) -> None:
    storage = open_storage(table)
    dead = {"holder": "dead", "host": "h", "pid": 1, "token": "t", "renewal": 0, "ttl_seconds": 1.0}
    storage.create(COMMIT_LOCK, json.dumps({**dead, "expires_at": "2026-01-01T00:00:00Z"}).encode())
    turns: list[tuple[str, float, float]] = []
    start = threading.Barrier(3)

    def take(name: str) -> None:
        start.wait()
        with commit_lock(table, holder=name, ttl=TTL) as held:
            began = time.monotonic()
            held.check()
            time.sleep(1.0)
            turns.append((name, began, time.monotonic()))

    takers = [threading.Thread(target=take, args=(name,)) for name in ("blue", "green", "red")]
    for taker in takers:
        taker.start()
    for taker in takers:
        taker.join(timeout=60)
    assert sorted(name for name, _, _ in turns) == ["blue", "green", "red"]
    ordered = sorted(turns, key=lambda t: t[1])
    assert all(earlier[2] <= later[1] for earlier, later in pairwise(ordered)), ordered
    assert storage.stat(COMMIT_LOCK) is None


def test_a_turn_not_renewed_lately_is_refused_before_the_write(table: str) -> None:
    with commit_lock(table, holder="blue", ttl=TTL) as held:
        held._stop.set()  # type: ignore[attr-defined]  # its renewals stop, as in a process that cannot reach S3
        time.sleep(TTL / 2 + 0.2)
        with pytest.raises(CommitTurnLost, match="last renewed"):
            held.check()
    assert held.lost is None, "nobody took it over meanwhile: released as it was"


def test_the_preflight_tries_the_conditional_writes_of_the_tables_store(table: str) -> None:
    storage = open_storage(table)
    assert conditional_writes(storage) is True
    assert not list(storage.list()), "its probe is removed"

    class Unconditional(S3Storage):
        """An S3 service that takes If-None-Match and If-Match for nothing (writes over, deletes whatever)."""

        def create(self, key: str, data: bytes) -> str:
            self.write(key, data)
            return str(self.token_of(data))

    assert isinstance(storage, S3Storage)
    ignoring = Unconditional(storage.bucket, storage.prefix, storage.settings)
    found = conditional_writes(ignoring)
    assert isinstance(found, str) and "took a create of a key that exists (If-None-Match)" in found, found
    assert not list(storage.list())


def test_a_failpoint_lines_two_processes_up(tmp_path: Path) -> None:
    """`meet`: each process's n-th arrival waits for another's n-th, so two drivers go to commit together."""
    code = "from spark_jobs.runtime.failpoints import failpoint\nfor _ in range(2): failpoint('here')\nprint('on')"
    env = {**os.environ, FAILPOINTS: f"here=meet:{tmp_path / 'meet'}"}
    first = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    with pytest.raises(subprocess.TimeoutExpired):
        first.wait(timeout=2)  # alone, it waits
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert second.stdout.strip() == "on" and first.communicate(timeout=30)[0].strip() == "on"
