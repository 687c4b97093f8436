"""The S3 store behind a faulty network (devtools/faulty_s3.py in front of the moto server).

First the proxy itself: byte-exact when it injects nothing, seeded, and each fault retried by the layer
that should (botocore up to the response headers, s3transfer for a GET body cut short), including a
conditional write whose response was lost. Then the real command line, as a user runs it, on a real Spark
checkpoint at 5%, 20% and 50% faults: every command succeeds or fails cleanly (exit 7, one line naming the
store and the fix, no traceback, no secret), and afterwards, without faults, every COMPLETED snapshot
verifies, nothing it references is missing, and every restore target holds a complete restore or nothing.
A live savepoint of a running query under faults too, while its batches commit and state maintenance
deletes files. The figures go to tests/artifacts/s3_faults.md."""

from __future__ import annotations

import base64
import http.client
import json
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from airflow_plugin.core.errors import InvalidInput, StoreUnavailable
from airflow_plugin.core.layout import BLOBS, PACKS
from airflow_plugin.core.lease import acquire, read_lease
from airflow_plugin.core.records.manifest import SnapshotStatus
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import S3Storage, open_storage
from devtools.embedded_s3 import EmbeddedS3
from devtools.faulty_s3 import FAULTS, FaultyS3
from tests.support.spark_kinds import KINDS, last_commit, read_state, run_and_stop, run_rounds
from tests.support.synthetic import tree, write_checkpoint

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
SECRET = "s3cr3t-never-shown-0b7e"  # the CLI's secret key: moto accepts any; it must never be printed


@pytest.fixture(scope="module")
def proxy(s3_server: EmbeddedS3) -> Iterator[FaultyS3]:
    with FaultyS3(s3_server.endpoint, latency=0.05) as server:
        yield server


@pytest.fixture(autouse=True)
def calm_proxy(proxy: FaultyS3) -> Iterator[None]:
    """Each test starts and ends without faults, whatever the previous one left."""
    proxy.calm()
    yield
    proxy.calm()


@pytest.fixture
def bucket(s3_store: str) -> str:
    return s3_store.removeprefix("s3://").split("/")[0]


def via(proxy: FaultyS3, bucket: str, prefix: str = "p", **settings: int) -> S3Storage:
    """Storage in `bucket` through the proxy."""
    return proxy.storage(bucket, prefix, **settings)


# ---------------------------------------------------------------- the proxy


def test_passes_everything_through_byte_for_byte(
    proxy: FaultyS3, s3_server: EmbeddedS3, bucket: str, tmp_path: Path
) -> None:
    storage = via(proxy, bucket, multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    direct = s3_server.client()
    big = tmp_path / "big"
    big.write_bytes(os.urandom(11 << 20))
    storage.upload(big, "big")  # multipart: 3 parts, each with Expect: 100-continue
    assert direct.head_object(Bucket=bucket, Key="p/big")["ETag"].strip('"').endswith("-3")
    storage.download("big", tmp_path / "back")  # ranged GETs
    assert (tmp_path / "back").read_bytes() == big.read_bytes()
    storage.write("small", b"\x00\xffbytes")
    assert storage.read("small") == b"\x00\xffbytes" and storage.stat("small").size == 7
    assert [i.key for i in storage.list()] == ["big", "small"]

    # an aws-chunked upload in chunked transfer encoding, with its checksum in a trailer (what botocore
    # sends for streaming uploads over https): the server decodes it and checks the checksum
    data = os.urandom(300_000)
    crc = zlib.crc32(data).to_bytes(4, "big")
    trailer = f"x-amz-checksum-crc32:{base64.b64encode(crc).decode()}\r\n".encode()
    aws_chunked = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (data[:200_000], data[200_000:]))
    aws_chunked += b"0\r\n" + trailer + b"\r\n"
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    pieces = [aws_chunked[i : i + 65_536] for i in range(0, len(aws_chunked), 65_536)]
    connection.request(
        "PUT",
        f"/{bucket}/p/chunked",
        body=iter(pieces),
        headers={
            "Content-Encoding": "aws-chunked",
            "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            "x-amz-trailer": "x-amz-checksum-crc32",
            "x-amz-decoded-content-length": str(len(data)),
        },
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 200, response.read()
    response.read()
    connection.close()
    assert direct.get_object(Bucket=bucket, Key="p/chunked")["Body"].read() == data
    assert storage.read("chunked") == data
    counts = proxy.counts()
    assert counts["requests"] == counts["passed"] > 10
    up, down = (11 << 20) + 7 + len(aws_chunked), (11 << 20) + 7 + 300_000 + 7  # the bodies, each way
    assert up <= counts["bytes_up"] < up + 100_000 and down <= counts["bytes_down"] < down + 100_000, counts


def test_faults_are_seeded(proxy: FaultyS3, bucket: str) -> None:
    storage = via(proxy, bucket, max_attempts=1)  # no retries: one request per call
    storage.write("k", b"v")

    def outcomes(seed: int) -> list[bool]:
        proxy.set_rate(0.3, seed=seed)
        results = []
        for _ in range(40):
            try:
                storage.stat("k")
                results.append(True)
            except StoreUnavailable:
                results.append(False)
        proxy.set_rate(0.0)
        return results

    first, again, other = outcomes(1), outcomes(1), outcomes(2)
    assert first == again and first != other and not all(first)


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "latency"])
def test_each_fault_is_retried(proxy: FaultyS3, bucket: str, fault: str, tmp_path: Path) -> None:
    storage = via(proxy, bucket)
    payload = os.urandom(100_000)
    for name, call, expect in (
        ("write", lambda: storage.write("obj", payload), None),
        ("read", lambda: storage.read("obj"), payload),
        ("download", lambda: storage.download("obj", tmp_path / "obj") or (tmp_path / "obj").read_bytes(), payload),
        ("list", lambda: [i.key for i in storage.list()], ["obj"]),
        ("stat", lambda: storage.stat("obj").size, len(payload)),
    ):
        proxy.reset_counts()
        proxy.force(fault)
        assert call() == expect, name
        assert proxy.counts()["requests"] == 2, (name, proxy.counts())  # the fault, then one retry


@pytest.mark.parametrize("fault", ["truncated", "reset_mid_response"])
def test_botocore_alone_does_not_retry_a_body_cut_short(proxy: FaultyS3, bucket: str, fault: str) -> None:
    """Why every GET goes through s3transfer: botocore's retries end with the response headers."""
    from botocore.exceptions import IncompleteReadError, ResponseStreamingError

    storage = via(proxy, bucket)
    storage.write("obj", os.urandom(100_000))
    proxy.force(fault)
    with pytest.raises((IncompleteReadError, ResponseStreamingError)):
        storage.client.get_object(Bucket=bucket, Key="p/obj")["Body"].read()


@pytest.mark.parametrize("fault", ["truncated", "reset_mid_response"])
def test_a_conditional_write_whose_answer_was_lost_is_still_ours(proxy: FaultyS3, bucket: str, fault: str) -> None:
    """The PUT succeeded but its answer was lost: botocore's retry gets 412 (someone wrote it: us)."""
    storage = via(proxy, bucket)
    proxy.reset_counts()
    proxy.force(fault)
    token = storage.create("lease", b"mine")
    assert storage.read_with_token("lease") == (b"mine", token)
    assert proxy.counts()["requests"] == 4  # PUT (answer lost), PUT (412), GET (it is ours), GET above
    proxy.force(fault)
    newer = storage.replace("lease", b"mine, renewed", token)
    assert storage.read_with_token("lease") == (b"mine, renewed", newer)
    proxy.force(fault)
    assert storage.delete_if("lease", newer) is False  # deleted by the first attempt; the retry found nothing
    assert storage.stat("lease") is None

    proxy.force(fault)
    lease = acquire(storage, "orders", "me@test:1", "deploy", ttl=60)
    assert read_lease(storage, "orders").token == lease.record.token
    lease.release()


def test_retry_settings_come_from_boto3s_environment(
    proxy: FaultyS3, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = via(proxy, bucket)
    proxy.set_rate(1.0, faults=["internal_error"])
    for attempts in ("1", "3"):
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", attempts)  # a new value: a new client
        proxy.reset_counts()
        with pytest.raises(StoreUnavailable, match=r"(500|InternalError).*AWS_MAX_ATTEMPTS allows more attempts"):
            storage.stat("k")
        assert proxy.counts()["requests"] == int(attempts)
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    proxy.calm()
    assert storage.stat("k") is None and storage.client.meta.config.retries["mode"] == "adaptive"
    for name, value, message in (
        ("AWS_MAX_ATTEMPTS", "ten", "not a positive whole number"),
        ("AWS_MAX_ATTEMPTS", "0", "not a positive whole number"),
        ("AWS_RETRY_MODE", "eager", "is not one of standard, adaptive, legacy"),
    ):
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
        monkeypatch.setenv(name, value)
        with pytest.raises(InvalidInput, match=message):
            storage.stat("k")
        monkeypatch.delenv(name)


def test_the_proxy_only_fronts_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultyS3("http://10.1.2.3:9000")
    with pytest.raises(ValueError, match="unknown faults"):
        FaultyS3("http://127.0.0.1:9000", faults=["meteor"])


# ---------------------------------------------------------------- the command line under faults

SEED = 20261121
SNAPSHOTS = {0.05: 3, 0.2: 3, 0.5: 2}  # per fault rate: snapshots created, each then verified and restored
OPS = ("create", "live savepoint", "verify", "restore", "restore to S3", "delete", "prune")
LIVE_SAVEPOINTS = {0.2: 3, 0.5: 3}  # per fault rate: savepoints of a query that runs meanwhile


@dataclass
class Tally:
    runs: int = 0
    ok: int = 0
    clean_failures: int = 0
    partial_left: int = 0  # restores whose cleanup failed too (reported, with the fix)
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("requests", *FAULTS), 0))

    def add(self, code: int, counts: dict[str, int], seconds: float) -> None:
        self.runs += 1
        self.seconds += seconds
        self.ok += code == 0
        self.clean_failures += code == 7
        for name in self.counts:
            self.counts[name] += counts.get(name, 0)


FIGURES: dict[str, dict[str, Tally]] = {}  # per fault setting, per operation


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    if not FIGURES:
        return
    lines = [
        "| faults | operation | runs | ok | clean failures (exit 7) | requests | 500 / 503 | resets | truncated "
        "| latency | retries | seconds per run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for setting, tallies in FIGURES.items():
        for op, t in tallies.items():
            if not t.runs:
                continue
            c = t.counts
            errors = c["internal_error"] + c["slow_down"]
            resets = c["reset"] + c["reset_mid_response"]
            # every fault but latency made the client retry, except the last one of each clean failure
            retries = errors + resets + c["truncated"] - t.clean_failures
            failures = f"{t.clean_failures}" + (f" ({t.partial_left} left a partial copy)" if t.partial_left else "")
            lines.append(
                f"| {setting} | {op} | {t.runs} | {t.ok} | {failures} | {c['requests']} | {errors} "
                f"| {resets} | {c['truncated']} | {c['latency']} | {retries} | {t.seconds / t.runs:.1f} |"
            )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "s3_faults.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


@pytest.fixture(scope="module")
def checkpoint(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real RocksDB changelog checkpoint for the module, stopped after 4 batches."""
    root = tmp_path_factory.mktemp("faults")
    ckpt = root / "ckpt"
    run_and_stop(spark, KINDS["rocksdb_changelog"], str(ckpt), str(root / "in"), str(root / "out"), range(4))
    return ckpt


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, object]:
        return json.loads(self.out)


def cli(proxy: FaultyS3, tally: Tally, *args: str, env: dict[str, str] | None = None) -> Run:
    """The real command line in a child process, its S3 through the proxy; a success or a clean failure."""
    env = {**os.environ, **proxy.env(), "AWS_SECRET_ACCESS_KEY": SECRET, **(env or {})}
    proxy.reset_counts()
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "airflow_plugin", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
        check=False,
    )
    tally.add(result.returncode, proxy.reset_counts(), time.monotonic() - started)
    run = Run(result.returncode, result.stdout, result.stderr)
    where = f"savepoints {' '.join(args)} -> exit {run.code}\n{run.err}"
    assert run.code in (0, 7), f"neither success nor a clean failure: {where}"
    assert "Traceback" not in run.err and SECRET not in run.out + run.err, where
    if run.code == 7:
        errors = [line for line in run.err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, where
        assert f"http://127.0.0.1:{proxy.port}" in errors[0] or "s3://" in errors[0], where
        assert "run the command again" in errors[0], where
    return run


def create_directly(store: str, checkpoint: Path) -> str:
    """A snapshot of job orders, in-process and straight to the moto server (no faults)."""
    manifest = create_snapshot(
        SnapshotStore(open_storage(store)), open_storage(str(checkpoint)), SnapshotRequest("orders")
    )
    return manifest.id


def local_tree_without_temp_files(root: Path) -> dict[str, bytes]:
    files = tree(root)
    assert not [name for name in files if name.endswith(".tmp") or ".tmp." in name], sorted(files)
    return files


def s3_tree(storage: S3Storage) -> dict[str, bytes]:
    return {info.key: storage.read(info.key) for info in storage.list()}


@pytest.mark.spark
@pytest.mark.parametrize("rate", sorted(SNAPSHOTS))
def test_commands_under_faults_succeed_or_fail_cleanly_and_leave_the_store_whole(
    proxy: FaultyS3, checkpoint: Path, s3_store: str, tmp_path: Path, rate: float
) -> None:
    tallies = FIGURES.setdefault(f"{rate:.0%}", {op: Tally() for op in OPS})
    store_args = ("--store", s3_store, "--concurrency", "8")
    proxy.set_rate(rate, seed=SEED + round(rate * 100))

    created: list[tuple[str, str]] = []
    for i in range(SNAPSHOTS[rate]):
        run = cli(proxy, tallies["create"], "create", f"job{i}", *store_args, "--checkpoint", str(checkpoint))
        if run.code == 0:
            created.append((f"job{i}", str(run.json()["id"])))
    for job, snapshot in created:
        run = cli(proxy, tallies["verify"], "verify", job, *store_args, snapshot)
        assert run.code == 7 or run.json()["ok"] is True
    targets: list[tuple[str, str, Path | str, Run]] = []
    for job, snapshot in created:
        target = tmp_path / f"restore-{job}"
        run = cli(proxy, tallies["restore"], "restore", job, *store_args, snapshot, "--to", str(target))
        targets.append((job, snapshot, target, run))
    if rate >= 0.2 and created:  # a remote target: its cleanup after a failure meets the faults too
        job, snapshot = created[0]
        target_uri = s3_store.rsplit("/", 1)[0] + f"/restored/{job}"
        run = cli(proxy, tallies["restore to S3"], "restore", job, *store_args, snapshot, "--to", target_uri)
        targets.append((job, snapshot, target_uri, run))

    # without faults: every restore target holds the complete restore, or nothing
    store = SnapshotStore(open_storage(s3_store))  # in-process: straight to the moto server
    for job, snapshot, target, run in targets:
        expected_root = tmp_path / f"expected-{job}"
        if not expected_root.exists():
            execute_restore(store, plan_restore(store, job, snapshot, open_storage(str(expected_root))))
        expected = tree(expected_root)
        if isinstance(target, Path):
            got = local_tree_without_temp_files(target)
        else:
            remote = open_storage(target)
            assert isinstance(remote, S3Storage)
            got = s3_tree(remote)
            # absolute paths inside transformWithState metadata differ by target; this kind has none
        if got not in ({}, expected):
            # only when removing what it wrote failed as well (the store kept failing): then it says so
            assert run.code == 7 and f"{target} holds a partial copy without commits/" in run.err, (
                f"{target} holds a partial restore, unreported: {sorted(set(expected) - set(got))[:5]}"
            )
            tallies["restore to S3" if isinstance(target, str) else "restore"].partial_left += 1

    if created:
        job, snapshot = created[-1]
        cli(proxy, tallies["delete"], "delete", job, snapshot, "--store", s3_store)  # no transfers: no --concurrency
    cli(
        proxy,
        tallies["prune"],
        "prune",
        "--store",
        s3_store,
        "--failed-grace",
        "0s",
        "--abandoned-after",
        "1s",
        "--blob-grace",
        "0s",
    )
    proxy.set_rate(0.0)

    # without faults: every COMPLETED snapshot verifies and nothing it references is missing
    stored = {info.key for prefix in (BLOBS, PACKS) for info in store.storage.list(prefix)}
    completed = [m for m in store.list() if m.status is SnapshotStatus.COMPLETED]
    for manifest in completed:
        assert set(manifest.objects) <= stored, f"{manifest.id} lost stored contents"
        assert verify_snapshot(store, manifest.job, manifest.id).ok, manifest.id
    assert {(m.job, m.id) for m in completed} >= set(created[:-1]), "a snapshot nobody deleted is gone"


@pytest.mark.spark
@pytest.mark.parametrize("rate", sorted(LIVE_SAVEPOINTS))
def test_a_live_savepoint_of_a_running_query_under_faults_is_whole_or_failed(
    spark: object, proxy: FaultyS3, s3_store: str, tmp_path: Path, rate: float
) -> None:
    """The query runs a batch every 200 ms and its state maintenance deletes old files (2 batches kept)
    while `savepoints create` copies its checkpoint through the faulty proxy. Each run succeeds or fails
    cleanly; afterwards, without faults, every COMPLETED savepoint verifies, restores into a checkpoint
    whose state reads at the savepoint's batch, and the query resumes from it at the next batch."""
    kind = KINDS["rocksdb_changelog"]
    tally = FIGURES.setdefault(f"{rate:.0%}", {op: Tally() for op in OPS})["live savepoint"]
    ckpt, inputs, output = (str(tmp_path / d) for d in ("ckpt", "in", "out"))
    query = kind.start(spark, ckpt, inputs, output, trigger={"processingTime": "200 milliseconds"})
    try:
        run_rounds(query, kind, inputs, range(3))
        proxy.set_rate(rate, seed=SEED + 7 + round(rate * 100))
        for round_no in range(3, 3 + LIVE_SAVEPOINTS[rate]):
            kind.feed(inputs, round_no)  # batches keep committing while the savepoint copies
            run = cli(proxy, tally, "create", "live", "--store", s3_store, "--checkpoint", ckpt)
            assert query.isActive, f"the query stopped: {query.exception()}"
            if run.code == 0:
                assert run.json()["batch_id"] <= last_commit(ckpt)
        proxy.set_rate(0.0)
        assert query.isActive, query.exception()
    finally:
        query.stop()
    store = SnapshotStore(open_storage(s3_store))
    completed = [m for m in store.list("live") if m.status is SnapshotStatus.COMPLETED]
    assert completed or tally.clean_failures == tally.runs
    for manifest in completed:
        assert verify_snapshot(store, "live", manifest.id).ok, manifest.id
        restored = str(tmp_path / f"restored-{manifest.id}")
        execute_restore(store, plan_restore(store, "live", manifest.id, open_storage(restored)))
        assert read_state(spark, restored, manifest.batch_id), f"{manifest.id}: no state at its batch"
    if completed:
        latest = completed[-1]
        # a round none of the savepoints saw: the resumed query has a batch to run even when the latest one
        # holds every batch the live query ran (its last one can be a no-data batch that moved the watermark)
        kind.feed(inputs, 3 + LIVE_SAVEPOINTS[rate])
        resumed = kind.start(spark, str(tmp_path / f"restored-{latest.id}"), inputs, str(tmp_path / "out2"))
        try:
            resumed.processAllAvailable()
            progress = resumed.recentProgress
            assert progress, f"the query restored from {latest.id} (batch {latest.batch_id}) ran no batch"
            assert progress[0]["batchId"] == latest.batch_id + 1
        finally:
            resumed.stop()


def test_a_store_that_keeps_failing_fails_every_command_cleanly(proxy: FaultyS3, s3_store: str, tmp_path: Path) -> None:
    """Each fault on every request (two attempts each, AWS_MAX_ATTEMPTS=2): exit 7 and one line, and
    nothing half-done is left behind."""
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=3)
    store_args = ("--store", s3_store)
    tallies = FIGURES.setdefault("100% of one fault, AWS_MAX_ATTEMPTS=2", {})
    snapshot = create_directly(s3_store, ckpt)
    commands = {
        "internal_error": ("create", "orders", "--checkpoint", str(ckpt)),
        "slow_down": ("list",),
        "reset": ("verify", "orders", snapshot),
        "reset_mid_response": ("restore", "orders", snapshot, "--to", str(tmp_path / "r1")),
        "truncated": ("restore", "orders", snapshot, "--to", str(tmp_path / "r2")),
    }
    for fault, (command, *args) in commands.items():
        proxy.set_rate(1.0, faults=[fault])
        tally = tallies.setdefault(f"{command} ({fault})", Tally())
        run = cli(proxy, tally, command, *store_args, *args, env={"AWS_MAX_ATTEMPTS": "2"})
        assert run.code == 7 and json.loads(run.out.splitlines()[-1])["exit_code"] == 7, (fault, run.err)
        print(f"{command} ({fault}): {run.err.strip()}")
    proxy.calm()
    store = SnapshotStore(open_storage(s3_store))
    assert [m.id for m in store.list() if m.status is SnapshotStatus.COMPLETED] == [snapshot]
    assert tree(tmp_path / "r1") == {} and tree(tmp_path / "r2") == {}


@pytest.mark.parametrize("cleanup", ["works", "fails too"])
def test_a_failed_restore_removes_what_it_wrote_or_says_what_is_left(
    proxy: FaultyS3, s3_store: str, tmp_path: Path, cleanup: str
) -> None:
    """A restore into S3 whose fourth file cannot be written: its cleanup removes the three it wrote, or,
    when the store fails the cleanup too, the one error line says the target holds a partial copy without
    commits/ and to delete it."""
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=3)
    snapshot = create_directly(s3_store, ckpt)
    target = s3_store.rsplit("/", 1)[0] + "/restored"
    proxy.force_matching("PUT", "/restored/", "internal_error", after=3)
    if cleanup == "fails too":
        proxy.force_matching("POST", "?delete", "internal_error")  # DeleteObjects
    args = ("restore", "orders", "--store", s3_store, snapshot, "--to", target, "--concurrency", "1")
    run = cli(proxy, Tally(), *args, env={"AWS_MAX_ATTEMPTS": "1"})
    assert run.code == 7
    left = s3_tree(open_storage(target))  # type: ignore[arg-type]
    if cleanup == "works":
        assert left == {} and "partial" not in run.err
    else:
        assert len(left) == 3 and not [key for key in left if key.startswith("commits/")]
        assert f"{target} holds a partial copy without commits/; delete it before restoring there again" in run.err
        print(run.err)
    proxy.calm()
    open_storage(target).delete(list(left))
    assert cli(proxy, Tally(), *args).code == 0  # the target is usable again
