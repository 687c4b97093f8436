"""files_for_version: unit tests on synthetic store listings, then real checkpoints of every kind restored
from a minimal copy holding only the files it selected."""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.errors import CheckpointChanged, CheckpointError
from airflow_plugin.core.snapshots.state_files import files_for_version
from tests.support import spark_kinds as sk

# ---------------------------------------------------------------- synthetic store files


def rocksdb_zip(ssts: Mapping[str, int], logs: Mapping[str, int] | None = None, header: str = "v1") -> bytes:
    """A `<v>.zip` as Spark writes it: RocksDB's small files plus `metadata` (a version line + JSON)."""
    meta: dict[str, Any] = {
        "sstFiles": [
            {"localFileName": n.split("-")[0] + ".sst", "dfsSstFileName": n, "sizeBytes": s} for n, s in ssts.items()
        ],
        "numKeys": 5,
    }
    if logs:
        meta["logFiles"] = [
            {"localFileName": n.split("-")[0] + ".log", "dfsLogFileName": n, "sizeBytes": s} for n, s in logs.items()
        ]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("CURRENT", "MANIFEST-000005\n")
        archive.writestr("metadata", f"{header}\n{json.dumps(meta)}")
    return buffer.getvalue()


def java_utf(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def lz4_stream(*blocks: tuple[int, bytes, int]) -> bytes:
    """lz4-java LZ4BlockOutputStream framing of (method, body, original length) blocks plus end mark."""
    out = b""
    for method, body, original in [*blocks, (0x10, b"", 0)]:
        out += b"LZ4Block" + bytes([method | 5]) + struct.pack("<iii", len(body), original, 0) + body
    return out


def changelog(lineage: list[tuple[int, str]], version: str = "v3") -> bytes:
    """Head of a format v2 changelog, in one uncompressed (raw) LZ4 block."""
    items = json.dumps([{"version": v, "checkpointUniqueId": u} for v, u in lineage])
    payload = java_utf(version) + java_utf(items) + b"\x00\x00\x00\x05hello"
    return lz4_stream((0x10, payload, len(payload)))


class Store:
    """A store dir in memory: listing + reader, like the caller provides them."""

    def __init__(self, files: Mapping[str, bytes | int]) -> None:
        self.data = {n: (b"x" * c if isinstance(c, int) else c) for n, c in files.items()}

    @property
    def listing(self) -> dict[str, int]:
        return {n: len(c) for n, c in self.data.items()}

    def read(self, name: str) -> bytes:
        if name not in self.data:
            raise FileNotFoundError(name)
        return self.data[name]

    def files(self, version: int, unique_id: str | None = None) -> list[str]:
        return files_for_version(self.listing, version, self.read, unique_id)


SST_A, SST_B, LOG_A = "000008-aaaa.sst", "000009-bbbb.sst", "000007-cccc.log"


# ---------------------------------------------------------------- HDFS-backed provider


def test_hdfs_newest_snapshot_plus_later_deltas() -> None:
    store = Store({f"{v}.delta": 3 for v in range(3, 9)} | {"3.snapshot": 4, "6.snapshot": 4, "9.snapshot": 4})
    assert store.files(8) == ["6.snapshot", "7.delta", "8.delta"]
    assert store.files(6) == ["6.snapshot"]


def test_hdfs_without_snapshot_replays_every_delta_from_1() -> None:
    assert Store({f"{v}.delta": 3 for v in range(1, 5)}).files(3) == ["1.delta", "2.delta", "3.delta"]


def test_version_zero_is_the_empty_state() -> None:
    assert Store({}).files(0) == []
    assert Store({"1_abc.changelog": changelog([])}).files(0) == []


def test_hdfs_missing_delta_names_file_and_version() -> None:
    store = Store({"2.snapshot": 3, "3.delta": 3, "5.delta": 3})
    with pytest.raises(CheckpointChanged, match=r"4\.delta .*version 5"):
        store.files(5)
    with pytest.raises(CheckpointChanged, match=r"1\.delta .*version 1"):
        Store({}).files(1)


def test_hadoop_crc_tmp_and_schema_files_are_ignored() -> None:
    store = Store(
        {
            "1.delta": 3,
            "2.delta": 3,
            ".2.delta.crc": 3,
            ".3.delta.5b1e0c2a-9e4c-4c0e-8a8e-2f2d1c0c4f00.tmp": 3,
            "_metadata/schema": 3,
            "_metadata/.schema.crc": 3,
        }
    )
    assert store.files(2) == ["1.delta", "2.delta"]


def test_negative_version_is_rejected() -> None:
    with pytest.raises(ValueError):
        Store({}).files(-1)


# ---------------------------------------------------------------- RocksDB


def test_rocksdb_zip_with_the_ssts_and_logs_its_metadata_lists() -> None:
    store = Store(
        {
            "4.zip": rocksdb_zip({SST_A: 10}),
            "5.zip": rocksdb_zip({SST_A: 10, SST_B: 20}, logs={LOG_A: 7}),
            f"SSTs/{SST_A}": 10,
            f"SSTs/{SST_B}": 20,
            "SSTs/000010-dddd.sst": 30,  # orphan or newer: not listed, not needed
            f"logs/{LOG_A}": 7,
            f"SSTs/.{SST_A}.crc": 1,
        }
    )
    assert store.files(5) == ["5.zip", f"SSTs/{SST_A}", f"SSTs/{SST_B}", f"logs/{LOG_A}"]
    assert store.files(4) == ["4.zip", f"SSTs/{SST_A}"]


def test_rocksdb_without_changelog_needs_the_zip_of_the_version() -> None:
    store = Store({"4.zip": rocksdb_zip({SST_A: 10}), f"SSTs/{SST_A}": 10})
    with pytest.raises(CheckpointChanged, match=r"5\.zip .*version 5"):
        store.files(5)


def test_rocksdb_sst_with_another_size_or_missing_raises() -> None:
    zip_ = rocksdb_zip({SST_A: 10, SST_B: 20})
    with pytest.raises(CheckpointChanged, match=rf"SSTs/{SST_B} .*5\.zip.*version 5.*19 bytes.*20"):
        Store({"5.zip": zip_, f"SSTs/{SST_A}": 10, f"SSTs/{SST_B}": 19}).files(5)
    with pytest.raises(CheckpointChanged, match=rf"SSTs/{SST_B} .*version 5"):
        Store({"5.zip": zip_, f"SSTs/{SST_A}": 10}).files(5)


def test_rocksdb_truncated_zip_or_unknown_metadata_version_raises() -> None:
    with pytest.raises(CheckpointChanged, match=r"5\.zip"):
        Store({"5.zip": rocksdb_zip({})[:40]}).files(5)
    with pytest.raises(CheckpointError, match="v9"):
        Store({"5.zip": rocksdb_zip({}, header="v9")}).files(5)


def test_rocksdb_vanished_while_reading_is_a_change() -> None:
    store = Store({"5.zip": rocksdb_zip({})})

    def read(name: str) -> bytes:
        raise FileNotFoundError(name)

    with pytest.raises(CheckpointChanged, match=r"5\.zip"):
        files_for_version(store.listing, 5, read)


def test_rocksdb_changelog_newest_zip_then_changelogs() -> None:
    files: dict[str, bytes | int] = {f"{v}.changelog": 5 for v in range(2, 10)}
    files |= {"3.zip": rocksdb_zip({SST_A: 10}), "6.zip": rocksdb_zip({SST_B: 20}), "10.zip": rocksdb_zip({})}
    files |= {f"SSTs/{SST_A}": 10, f"SSTs/{SST_B}": 20}
    store = Store(files)
    assert store.files(8) == ["6.zip", "7.changelog", "8.changelog", f"SSTs/{SST_B}"]
    assert store.files(6) == ["6.zip", f"SSTs/{SST_B}"]
    assert store.files(5) == ["3.zip", "4.changelog", "5.changelog", f"SSTs/{SST_A}"]


def test_rocksdb_changelog_without_zip_replays_from_1() -> None:
    store = Store({f"{v}.changelog": 5 for v in range(1, 4)})
    assert store.files(3) == ["1.changelog", "2.changelog", "3.changelog"]
    with pytest.raises(CheckpointChanged, match=r"1\.changelog .*version 3"):
        Store({"2.changelog": 5, "3.changelog": 5}).files(3)


# ---------------------------------------------------------------- checkpoint format v2

A, B, C, R = "aaaaaaaa-0000", "bbbbbbbb-1111", "cccccccc-2222", "rrrrrrrr-9999"


def test_v2_zip_of_the_committed_id_is_enough() -> None:
    store = Store(
        {
            f"5_{A}.zip": rocksdb_zip({SST_A: 10}),
            f"5_{A}.zip.crc": b'{"algorithm":"CRC32C"}',
            f"5_{A}.changelog": changelog([(4, B)]),
            f"5_{R}.zip": rocksdb_zip({SST_B: 20}),  # a retry's file of the same version
            f"SSTs/{SST_A}": 10,
        }
    )
    assert store.files(5, A) == [f"5_{A}.zip", f"5_{A}.zip.crc", f"SSTs/{SST_A}"]


def test_v2_follows_the_changelog_lineage_to_its_base_zip() -> None:
    store = Store(
        {
            f"3_{B}.zip": rocksdb_zip({SST_A: 10}),
            f"3_{B}.changelog": changelog([(2, C)]),
            f"4_{R}.zip": rocksdb_zip({SST_B: 20}),  # not in the lineage: another attempt's version 4
            f"4_{A}.changelog": changelog([(3, B)]),
            f"4_{A}.changelog.crc": b"{}",
            f"4_{R}.changelog": changelog([(3, B)]),
            f"5_{C}.changelog": changelog([(3, B), (4, A)]),
            f"SSTs/{SST_A}": 10,
            f"SSTs/{SST_B}": 20,
        }
    )
    assert store.files(5, C) == [
        f"3_{B}.zip",
        f"4_{A}.changelog",
        f"4_{A}.changelog.crc",
        f"5_{C}.changelog",
        f"SSTs/{SST_A}",
    ]


def test_v2_lineage_from_version_1_starts_from_the_empty_state() -> None:
    store = Store(
        {
            f"1_{A}.changelog": changelog([]),
            f"2_{B}.changelog": changelog([(1, A)], version="v4"),
            f"2_{R}.zip": rocksdb_zip({}),
        }
    )
    assert store.files(2, B) == [f"1_{A}.changelog", f"2_{B}.changelog"]


def test_v2_missing_base_zip_or_changelog_raises() -> None:
    lineage = [(3, B), (4, A)]
    with pytest.raises(CheckpointChanged, match=rf"3_{B}\.zip .*version 5"):
        Store({f"4_{A}.changelog": 5, f"5_{C}.changelog": changelog(lineage)}).files(5, C)
    with pytest.raises(CheckpointChanged, match=rf"4_{A}\.changelog .*version 5"):
        Store({f"3_{B}.zip": rocksdb_zip({}), f"5_{C}.changelog": changelog(lineage)}).files(5, C)
    with pytest.raises(CheckpointChanged, match=rf"5_{C}\.changelog .*version 5"):
        Store({f"3_{B}.zip": rocksdb_zip({}), f"5_{A}.changelog": changelog(lineage)}).files(5, C)


def test_v2_needs_the_unique_id() -> None:
    with pytest.raises(CheckpointError, match="unique id"):
        Store({f"5_{C}.changelog": changelog([(4, A)])}).files(5)


def test_v2_changelog_without_lineage_or_other_codec_raises() -> None:
    with pytest.raises(CheckpointError, match="v2"):
        Store({f"5_{C}.changelog": changelog([(4, A)], version="v2")}).files(5, C)
    with pytest.raises(CheckpointError, match="zstd"):
        Store({f"5_{C}.changelog": b"\x28\xb5\x2f\xfd" + b"\x00" * 20}).files(5, C)


def test_v2_lineage_in_an_lz4_compressed_block_with_overlapping_matches() -> None:
    items = json.dumps([{"version": 4, "checkpointUniqueId": A}])
    head = java_utf("v3") + java_utf(items)
    # one LZ4 block: the header as literals + a match "!!" repeating it 4 times (offset 2 < length 8),
    # then a literal-only last sequence.
    body = bytes([0xF0 | 8 - 4, len(head) + 2 - 15]) + head + b"!!" + b"\x02\x00" + b"\x10" + b"?"
    data = lz4_stream((0x20, body, len(head) + 2 + 8 + 1))
    store = Store({f"4_{A}.zip": rocksdb_zip({}), f"5_{C}.changelog": data})
    assert store.files(5, C) == [f"4_{A}.zip", f"5_{C}.changelog"]


@pytest.mark.spark
def test_v2_lineage_written_by_sparks_own_lz4_codec(spark: Any) -> None:
    """Compress a long lineage with the JVM's LZ4CompressionCodec (several 32 KiB blocks)."""
    jvm = spark.sparkContext._jvm
    lineage = [(v, f"{v:08d}-1111-2222-3333-444444444444") for v in range(3, 700)]
    items = json.dumps([{"version": v, "checkpointUniqueId": u} for v, u in lineage])
    raw = jvm.java.io.ByteArrayOutputStream()
    codec = jvm.org.apache.spark.io.LZ4CompressionCodec(spark.sparkContext._jsc.sc().conf())
    out = jvm.java.io.DataOutputStream(codec.compressedOutputStream(raw))
    out.writeUTF("v3")
    out.writeUTF(items)
    out.writeInt(-1)
    out.close()
    data = bytes(raw.toByteArray())
    assert data.startswith(b"LZ4Block") and data.count(b"LZ4Block") > 2
    uid = "99999999-0000"
    files = {f"700_{uid}.changelog": data, f"3_{lineage[0][1]}.zip": rocksdb_zip({})}
    files |= {f"{v}_{u}.changelog": 5 for v, u in lineage[1:]}
    expected = {f"3_{lineage[0][1]}.zip", f"700_{uid}.changelog"}
    expected |= {f"{v}_{u}.changelog" for v, u in lineage[1:]}
    assert Store(files).files(700, uid) == sorted(expected)


# ---------------------------------------------------------------- real checkpoints of every kind

PRE_ROUNDS, POST_ROUNDS = 2, 2
VERSION_OF = re.compile(r"^(\d+)[._]")


def store_dirs(checkpoint: Path) -> list[Path]:
    """`state/<op>/<partition>` or, for operators with named stores (joins), `.../<partition>/<store>`."""
    stores: list[Path] = []
    for op in sorted(p for p in (checkpoint / "state").glob("*") if p.name.isdigit()):
        for part in sorted(p for p in op.iterdir() if p.name.isdigit()):
            named = [d for d in part.iterdir() if d.is_dir() and d.name not in ("_metadata", "SSTs", "logs")]
            stores += sorted(named) or [part]
    return stores


def listing(store: Path) -> dict[str, int]:
    sizes = {}
    for p in store.rglob("*"):
        if p.is_file() and not p.name.startswith(".") and "_metadata" not in p.parts:
            try:
                sizes[p.relative_to(store).as_posix()] = p.stat().st_size
            except FileNotFoundError:  # state maintenance deleted it since the directory was read
                continue
    return sizes


def snapshotted_and_cleaned(checkpoint: Path) -> Callable[[], bool]:
    """In every store maintenance has written a snapshot or zip and deleted version 1. The next commit then needs
    deltas or changelogs on top of a base that is not the newest file. (Not "the newest version has a base": a
    store takes a base every minDeltasForSnapshot versions, and a join's round that commits two versions, its data
    batch and a no-data batch, can keep the bases off the newest version for as many rounds as it likes.)"""

    def check() -> bool:
        try:
            return _snapshotted_and_cleaned(checkpoint)
        except FileNotFoundError:  # maintenance runs concurrently with this look: look again
            return False

    return check


def _snapshotted_and_cleaned(checkpoint: Path) -> bool:
    stores = store_dirs(checkpoint)
    for store in stores:
        names = [n for n in listing(store) if "/" not in n]
        versions = {int(m[1]) for n in names if (m := VERSION_OF.match(n))}
        bases = {int(m[1]) for n in names if (m := VERSION_OF.match(n)) and n.endswith((".snapshot", ".zip"))}
        if not bases or 1 in versions:
            return False
    return bool(stores)


def unique_id(commit: Mapping[str, Any], checkpoint: Path, store: Path) -> str | None:
    ids = commit.get("stateUniqueIds")
    if not ids:
        return None
    op, part, *named = store.relative_to(checkpoint / "state").parts
    # One id per store, in Spark's store order (joins: left-keyToNumValues, left-keyWithIndexToValue,
    # right-keyToNumValues, right-keyWithIndexToValue), which is also their sorted order.
    names = sorted(d.name for d in store.parent.iterdir() if d.is_dir() and d.name[0] != "_") if named else []
    return ids[op][int(part)][names.index(named[0]) if named else 0]


def read_commit(checkpoint: Path, batch_id: int) -> dict[str, Any]:
    return json.loads((checkpoint / "commits" / str(batch_id)).read_text().splitlines()[1])


def minimal_copy(src: Path, dst: Path) -> tuple[int, dict[str, list[str]]]:
    """Copy batch N's restart set: metadata logs of N, sources, operator metadata and schemas, and per
    store exactly the files files_for_version selected. Returns N and the selection per store dir."""
    n = sk.last_commit(str(src))
    commit = read_commit(src, n)
    wanted = ["metadata", f"offsets/{n - 1}", f"offsets/{n}", f"commits/{n}"]
    wanted += [p.relative_to(src).as_posix() for p in (src / "sources").rglob("*") if p.is_file()]
    for op in (src / "state").glob("*"):
        meta = [*op.glob("_metadata/**/*"), *op.glob("_stateSchema/**/*"), *op.glob("*/**/_metadata/**/*")]
        wanted += [p.relative_to(src).as_posix() for p in meta if p.is_file()]
    selected: dict[str, list[str]] = {}
    for store in store_dirs(src):
        rel = store.relative_to(src).as_posix()
        version = n + 1
        selected[rel] = files_for_version(
            listing(store), version, lambda name, s=store: (s / name).read_bytes(), unique_id(commit, src, store)
        )
        wanted += [f"{rel}/{name}" for name in selected[rel]]
    for rel in wanted:
        if Path(rel).name.startswith("."):  # Hadoop checksums are never copied
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)
    rewrite_schema_paths(dst, f"file:{src}", f"file:{dst}")
    return n, selected


def rewrite_schema_paths(checkpoint: Path, old: str, new: str) -> None:
    """transformWithState's `state/<op>/_metadata/v2/<batch>`: a `v2` line, then JSON whose
    `stateStoreInfo[].stateSchemaFilePaths` are ABSOLUTE URIs of the `_stateSchema` files."""
    for meta in checkpoint.glob("state/*/_metadata/v2/*"):
        header, body = meta.read_text().split("\n", 1)
        doc = json.loads(body)
        for info in doc["stateStoreInfo"]:
            info["stateSchemaFilePaths"] = [
                new + p.removeprefix(old) if p.startswith(old) else p for p in info["stateSchemaFilePaths"]
            ]
        meta.write_text(f"{header}\n{json.dumps(doc, separators=(',', ':'))}")


@pytest.mark.spark
@pytest.mark.parametrize("name", list(sk.KINDS))
def test_minimal_copy_restores_every_kind(spark: Any, tmp_path: Path, name: str) -> None:
    kind = sk.KINDS[name]
    original, copy, inputs, output = (str(tmp_path / d) for d in ("orig", "copy", "in", "out"))
    query = kind.start(spark, original, inputs, output)
    try:
        sk.run_rounds(query, kind, inputs, range(PRE_ROUNDS))
        next_round = PRE_ROUNDS
        if kind.stateful:
            next_round = sk.run_until(query, kind, inputs, next_round, snapshotted_and_cleaned(Path(original)))
        # One more commit on top of the snapshots, so that deltas / changelogs after a base are needed.
        sk.run_rounds(query, kind, inputs, [next_round])
    finally:
        query.stop()
    n = sk.last_commit(original)
    assert sk.batch_ids(Path(original) / "offsets")[-1] == n, "stopped inside a batch"

    n_copied, selected = minimal_copy(Path(original), Path(copy))
    assert n_copied == n
    assert bool(selected) == kind.stateful
    copied = sorted(p.relative_to(copy).as_posix() for p in Path(copy).rglob("*") if p.is_file())
    assert not [p for p in copied if Path(p).name.startswith(".")]
    expected_state = sk.read_state(spark, original, n)
    if kind.stateful:
        assert expected_state and all(expected_state.values())
    assert sk.read_state(spark, copy, n) == expected_state
    sk.remove_stopped_checkpoint(original)  # the copy must stand on its own

    query = kind.start(spark, copy, inputs, output)
    try:
        sk.run_rounds(query, kind, inputs, range(next_round + 1, next_round + 1 + POST_ROUNDS))
        first = min(p.batchId for p in query.recentProgress)
    finally:
        query.stop()
    assert first == n + 1

    ref_ckpt, ref_in, ref_out = (str(tmp_path / d) for d in ("ref", "ref_in", "ref_out"))
    for round_no in range(next_round + 1 + POST_ROUNDS):
        kind.feed(ref_in, round_no)
    sk.run_and_stop(spark, kind, ref_ckpt, ref_in, ref_out, [])
    expected = kind.final_output(spark, ref_out)
    assert expected
    assert kind.final_output(spark, output) == expected
