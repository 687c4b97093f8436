"""Storage behind one interface: local paths and S3 (the moto server), URI parsing."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_plugin.core.errors import Conflict, InvalidInput, Refused
from airflow_plugin.core.storage import LocalStorage, S3Settings, S3Storage, Storage, open_storage


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_storage(str(tmp_path / "root"))
    return open_storage(request.getfixturevalue("s3_store"))


def test_write_read_list_stat_delete(storage: Storage, tmp_path: Path) -> None:
    assert not storage.exists() and list(storage.list()) == []
    storage.write("a/b/1", b"one")
    storage.write("a/b/2", b"two!")
    storage.write("a/c", b"")
    storage.write("a/b/1", b"ONE")  # replace
    source = tmp_path / "upload.bin"
    source.write_bytes(b"x" * 1000)
    storage.upload(source, "up/file")

    assert storage.read("a/b/1") == b"ONE"
    assert sorted((i.key, i.size) for i in storage.list("a/b/")) == [("a/b/1", 3), ("a/b/2", 4)]
    assert sorted(i.key for i in storage.list("a/")) == ["a/b/1", "a/b/2", "a/c"]
    assert storage.stat("up/file").size == 1000 and storage.stat("nope") is None
    with pytest.raises(FileNotFoundError):
        storage.read("nope")
    storage.download("up/file", tmp_path / "down/file")
    assert (tmp_path / "down/file").read_bytes() == source.read_bytes()
    assert [i.key for i in storage.child("a/b").list()] == ["1", "2"]

    storage.delete(["a/b/1", "a/c", "never-existed"])
    assert sorted(i.key for i in storage.list()) == ["a/b/2", "up/file"]


def test_a_listing_can_start_after_a_key(storage: Storage) -> None:
    """What a Delta log's reader asks for what is new: the keys after the newest it saw, in key order (S3: one
    ListObjectsV2 with StartAfter, whose pages hold only those)."""
    for key in ("log/00.json", "log/01.crc", "log/01.json", "log/02.json", "log/_last", "other/03.json"):
        storage.write(key, b"x")
    assert [i.key for i in storage.list("log/", start_after="log/01.json")] == ["log/02.json", "log/_last"]
    assert [i.key for i in storage.list("log/", start_after="log/01")] == [
        "log/01.crc",
        "log/01.json",
        "log/02.json",
        "log/_last",
    ], "a key's stem: every file of that version and after"
    assert [i.key for i in storage.list("log/", start_after="log/_last")] == []
    assert [i.key for i in storage.list("log/", start_after="a")] == [i.key for i in storage.list("log/")]
    assert [i.key for i in storage.child("log").list(start_after="01.json")] == ["02.json", "_last"]


def test_unsafe_keys_are_refused(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    for key in ("../escape", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(InvalidInput, match="unsafe relative path"):
            storage.write(key, b"x")
    assert list(tmp_path.parent.glob("escape")) == []


def test_s3_deletes_in_batches_of_1000(s3_store: str) -> None:
    storage = open_storage(s3_store)
    keys = [f"many/{i:05d}" for i in range(2500)]
    client = storage.client
    for key in keys:
        client.put_object(Bucket=storage.bucket, Key=f"{storage.prefix}/{key}", Body=b"")
    assert storage.delete(keys) == 2500
    assert list(storage.list("many/")) == []


def test_s3_directory_markers_are_not_files(s3_store: str) -> None:
    """S3A writes an empty object `dir/` for a mkdirs (a checkpoint's `offsets/`, `state/0/`): no file."""
    storage = open_storage(s3_store)
    for key in ("ckpt/", "ckpt/offsets/", "ckpt/offsets/0"):
        storage.client.put_object(Bucket=storage.bucket, Key=f"{storage.prefix}/{key}", Body=b"")
    assert [info.key for info in storage.list()] == ["ckpt/offsets/0"]


@pytest.mark.parametrize(
    ("settings", "environ", "expected"),
    [
        (S3Settings(), {}, {}),  # AWS itself: S3A finds the endpoint from the region
        (S3Settings(region_name="eu-west-1"), {}, {"endpoint.region": "eu-west-1"}),
        (
            S3Settings(endpoint_url="http://127.0.0.1:9000", access_key_id="AKIA", secret_access_key="s3cr3t"),
            {},
            {"endpoint": "http://127.0.0.1:9000", "path.style.access": "true", "connection.ssl.enabled": "false"},
        ),
        (
            S3Settings(),
            {"AWS_ENDPOINT_URL": "https://s3.example.internal", "AWS_DEFAULT_REGION": "us-east-1"},
            {"endpoint": "https://s3.example.internal", "path.style.access": "true", "endpoint.region": "us-east-1"},
        ),
    ],
)
def test_spark_reaches_the_stores_s3_through_s3a_without_keys_in_its_conf(
    settings: S3Settings, environ: dict[str, str], expected: dict[str, str]
) -> None:
    conf = settings.spark_conf(environ)
    expected = {"create.checksum.algorithm": "SHA256", **expected}  # for copies within S3 (snapshots/create.py)
    assert conf == {f"spark.hadoop.fs.s3a.{key}": value for key, value in expected.items()}
    assert "s3cr3t" not in str(conf) and "AKIA" not in str(conf)
    assert settings.child_env().get("AWS_SECRET_ACCESS_KEY", "s3cr3t") == "s3cr3t"  # the keys go by environment


def test_s3_large_files_go_multipart(s3_store: str, tmp_path: Path) -> None:
    base = open_storage(s3_store)
    storage = S3Storage(base.bucket, base.prefix, S3Settings(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    big = tmp_path / "big"
    big.write_bytes(os.urandom(11 << 20))
    storage.upload(big, "big")
    etag = storage.client.head_object(Bucket=storage.bucket, Key=f"{storage.prefix}/big")["ETag"]
    assert etag.strip('"').endswith("-3"), etag  # three parts
    storage.download("big", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == big.read_bytes()


@pytest.mark.parametrize(
    ("uri", "kind", "root"),
    [
        ("/data/ckpt", LocalStorage, "/data/ckpt"),
        ("file:///data/ckpt", LocalStorage, "/data/ckpt"),
        ("file:/data/ckpt", LocalStorage, "/data/ckpt"),
        ("s3://bucket/a/b/", S3Storage, "s3://bucket/a/b"),
        ("s3a://bucket/a", S3Storage, "s3://bucket/a"),
        ("s3://bucket", S3Storage, "s3://bucket"),
    ],
)
def test_uris(uri: str, kind: type, root: str) -> None:
    storage = open_storage(uri)
    assert isinstance(storage, kind) and storage.uri == root


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "empty location"),
        ("s3://", "malformed S3 URI"),
        ("s3://UPPER/x", "malformed S3 URI"),
        ("s3://bucket/../x", "unsafe relative path"),
        ("gs://bucket/x", "unsupported location"),
        ("file://host/x", "malformed file URI"),
        ("s3://key:secret@bucket/x", "credentials do not belong in the URI"),
    ],
)
def test_malformed_uris(uri: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as info:
        open_storage(uri)
    assert "secret" not in str(info.value)


# ---------------------------------------------------------------- conditional writes (the lease's building blocks)


def test_conditional_writes(storage: Storage) -> None:
    token = storage.create("lease", b"one")
    with pytest.raises(Conflict, match=r"already exists|someone else"):
        storage.create("lease", b"two")
    assert storage.read_with_token("lease") == (b"one", token)

    newer = storage.replace("lease", b"two", token)
    assert newer != token and storage.read_with_token("lease") == (b"two", newer)
    with pytest.raises(Conflict):
        storage.replace("lease", b"three", token)  # stale token: nothing written
    assert storage.read("lease") == b"two"

    with pytest.raises(Conflict):
        storage.delete_if("lease", token)
    assert storage.read("lease") == b"two"
    assert storage.delete_if("lease", newer) is True
    assert storage.stat("lease") is None
    assert storage.delete_if("lease", newer) is False  # already gone
    with pytest.raises(Conflict):
        storage.replace("lease", b"four", newer)  # a missing key is a conflict, not a create
    assert storage.stat("lease") is None
    with pytest.raises(FileNotFoundError):
        storage.read_with_token("lease")


def test_conflict_is_a_refusal_with_exit_code_4() -> None:
    from airflow_plugin.cli.exit_codes import exit_code

    assert issubclass(Conflict, Refused) and exit_code(Conflict("lost a race")) == 4


def _race(storage: Storage, attempt: Callable[[int], str], racers: int = 8) -> list[int]:
    """Start `racers` threads together; the indices of those whose attempt succeeded."""
    barrier = threading.Barrier(racers)
    winners: list[int] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            attempt(i)
            winners.append(i)
        except Conflict:
            pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return winners


def test_racing_creates_and_replaces_have_one_winner(storage: Storage) -> None:
    for round_no in range(3):
        key = f"race-{round_no}"
        winners = _race(storage, lambda i, key=key: storage.create(key, f"racer {i}".encode()))
        assert len(winners) == 1 and storage.read(key) == f"racer {winners[0]}".encode()

        _, token = storage.read_with_token(key)
        winners = _race(storage, lambda i, key=key, token=token: storage.replace(key, f"taker {i}".encode(), token))
        assert len(winners) == 1 and storage.read(key) == f"taker {winners[0]}".encode()


def test_local_create_is_never_seen_half_written(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    data = os.urandom(64 << 20)
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.append(len(storage.read("big")))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        storage.create("big", data)
    finally:
        done.set()
        thread.join()
    assert storage.read("big") == data
    assert set(seen) <= {len(data)}, f"a reader saw a partial file: {sorted(set(seen))[:5]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]  # no temp file left behind


def test_s3_empty_object_has_a_token(s3_store: str) -> None:
    storage = open_storage(s3_store)
    token = storage.create("empty", b"")
    assert storage.read_with_token("empty") == (b"", token)
    assert storage.replace("empty", b"x", token) != token
