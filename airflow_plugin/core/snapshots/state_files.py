"""Which files of one state store directory rebuild state version V (V = N+1 for committed batch N).

Batch b loads state version b and commits version b+1, so restarting after batch N needs version N+1.
What rebuilds it is decided from what is ON DISK, never from a formula, because Spark's maintenance
thread decides when snapshots appear and which old files go (docs/spark-checkpoints.md, sections 1 and 2).
Only the rules Spark itself follows when it loads a version are used here:

- HDFS-backed provider (`<v>.delta` per commit, `<v>.snapshot` by maintenance): the newest snapshot
  s <= V, then `<s+1..V>.delta`; with no snapshot, `1..V.delta` on top of the empty version 0.
- RocksDB (`<v>.zip`, optionally `<v>.changelog` per commit with changelog checkpointing): the newest
  zip s <= V, then `<s+1..V>.changelog`; with no zip, all changelogs from 1. A zip holds RocksDB's own
  small files plus a `metadata` entry (`v1` line, then JSON) naming the shared immutable files it uses:
  `sstFiles[].dfsSstFileName` under `SSTs/` and `logFiles[].dfsLogFileName` under `logs/`, each with
  `sizeBytes`. Those are needed too, and must have exactly that size (an SST is uploaded before the
  zip that names it, so a different size means a partial or replaced file).
- Checkpoint format v2 (`<v>_<uniqueId>.zip/.changelog`; retries leave several files per version, so
  the version number alone is ambiguous): start from the unique id committed in `commits/N`. If
  `<V>_<id>.zip` exists it is the whole truth. Otherwise `<V>_<id>.changelog` starts (inside the
  compressed stream) with Java `writeUTF("v3"|"v4")` and `writeUTF(<lineage JSON>)`, the lineage being
  `[{"version": v, "checkpointUniqueId": id}, ...]` for versions [latest snapshot, V-1]. The base is the
  newest lineage entry whose zip exists (none, and the lineage starts at 1: the empty version 0), then
  the lineage's changelogs after it.
- Spark 4.1+ writes `<name>.crc` JSON checksum companions for state files (seen with format v2); they
  are returned alongside their file when present. Hadoop's `.<name>.crc` and in-flight `.<name>.<uuid>.tmp`
  files (every name starting with a dot) are ignored.

Files under the store dir's `_metadata/` (the operator's schema in partition 0) are not state versions
and are left to the caller. A needed file that is missing (cleanup ran) raises CheckpointChanged: the
caller retries at a newer batch.
"""

from __future__ import annotations

import io
import json
import re
import struct
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence

from airflow_plugin.core.errors import CheckpointChanged, CheckpointError

Read = Callable[[str], bytes]
# the SST and log files a zip lists, by zip name, (name, size) each: known without reading the zip (the zip is
# unchanged since an earlier snapshot held it and them: snapshots/checkpoint.py `zip_listings`)
Listed = Mapping[str, Sequence[tuple[str, int]]]

_HDFS = re.compile(r"^(\d+)\.(delta|snapshot)$")
_ROCKSDB = re.compile(r"^(\d+)\.(zip|changelog)$")
_ROCKSDB_V2 = re.compile(r"^(\d+)_([0-9A-Za-z-]+)\.(zip|changelog)$")


def files_for_version(
    listing: Mapping[str, int],
    version: int,
    read: Read,
    unique_id: str | None = None,
    listed: Listed | None = None,
) -> list[str]:
    """Relative names (in this store dir) of every file needed to rebuild `version`, sorted. `listed`: what
    some zips list, known without reading them (checked against `listing` all the same)."""
    if version < 0:
        raise ValueError(f"state version must be >= 0, got {version}")
    files = {name: size for name, size in listing.items() if not _ignored(name)}
    if version == 0:  # the empty state before batch 0: nothing on disk describes it
        return []
    top = [name for name in files if "/" not in name]
    if unique_id is not None or any(_ROCKSDB_V2.match(n) for n in top):
        if unique_id is None:
            raise CheckpointError(
                f"state version {version}: the store holds checkpoint format v2 files "
                "(<version>_<uniqueId>.zip/.changelog): pass the unique id from commits/N"
            )
        needed = _rocksdb_v2(files, version, _Zips(read, listed or {}), unique_id)
    elif any(_ROCKSDB.match(n) for n in top):
        needed = _rocksdb(files, version, _Zips(read, listed or {}))
    else:
        needed = _hdfs(files, version)
    with_checksums = needed + [f"{name}.crc" for name in needed if f"{name}.crc" in files]
    return sorted(set(with_checksums))


def _ignored(name: str) -> bool:
    """Hadoop `.x.crc` checksums and `.x.<uuid>.tmp` in-flight files, and the schema under `_metadata/`."""
    return name.rsplit("/", 1)[-1].startswith(".") or name.split("/", 1)[0] == "_metadata"


def _require(files: Mapping[str, int], name: str, version: int) -> str:
    if name not in files:
        raise CheckpointChanged(f"state file {name} needed for state version {version} is missing")
    return name


def _hdfs(files: Mapping[str, int], version: int) -> list[str]:
    """Newest `<s>.snapshot` with s <= V, then `<s+1..V>.delta` (no snapshot: deltas from 1)."""
    snapshots = [int(m[1]) for n in files if (m := _HDFS.match(n)) and m[2] == "snapshot"]
    base = max((s for s in snapshots if s <= version), default=0)
    needed = [f"{base}.snapshot"] if base else []
    needed += [_require(files, f"{v}.delta", version) for v in range(base + 1, version + 1)]
    return needed


class _Zips:
    """Reads a store's files; what a zip lists comes from `listed` where it is known, else from the zip."""

    def __init__(self, read: Read, listed: Listed) -> None:
        self.read, self.listed = read, listed

    def files(self, zip_name: str, version: int) -> Sequence[tuple[str, int]]:
        known = self.listed.get(zip_name)
        return known if known is not None else zip_listing(_read(self.read, zip_name, version), zip_name, version)


def zip_listing(data: bytes, zip_name: str, version: int) -> list[tuple[str, int]]:
    """The SST and log files (name in the store dir, size) a RocksDB zip's `metadata` entry lists."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            text = archive.read("metadata").decode("utf-8")
    except (zipfile.BadZipFile, KeyError) as e:
        raise CheckpointChanged(f"state file {zip_name} (state version {version}) is not a complete zip") from e
    header, _, body = text.partition("\n")
    if header != "v1":
        raise CheckpointError(f"{zip_name}: unsupported RocksDB checkpoint metadata version {header!r}")
    metadata = json.loads(body)
    listed = [(f"SSTs/{f['dfsSstFileName']}", f["sizeBytes"]) for f in metadata.get("sstFiles") or []]
    return listed + [(f"logs/{f['dfsLogFileName']}", f["sizeBytes"]) for f in metadata.get("logFiles") or []]


def _rocksdb(files: Mapping[str, int], version: int, reader: _Zips) -> list[str]:
    """Newest `<s>.zip` with s <= V (plus the files its metadata lists), then `<s+1..V>.changelog`."""
    zips = [int(m[1]) for n in files if (m := _ROCKSDB.match(n)) and m[2] == "zip"]
    base = max((z for z in zips if z <= version), default=0)
    if base < version and not any(n.endswith(".changelog") for n in files):
        _require(files, f"{version}.zip", version)  # changelog checkpointing off: one zip per version
    needed = _zip_and_immutables(files, f"{base}.zip", version, reader) if base else []
    needed += [_require(files, f"{v}.changelog", version) for v in range(base + 1, version + 1)]
    return needed


def _rocksdb_v2(files: Mapping[str, int], version: int, reader: _Zips, unique_id: str) -> list[str]:
    """Format v2: the committed `<V>_<id>.zip`, or the changelog lineage of `<V>_<id>` back to a zip."""
    if f"{version}_{unique_id}.zip" in files:
        return _zip_and_immutables(files, f"{version}_{unique_id}.zip", version, reader)
    changelog = _require(files, f"{version}_{unique_id}.changelog", version)
    chain = sorted({*_changelog_lineage(_read(reader.read, changelog, version), changelog), (version, unique_id)})
    based_on = [(v, uid) for v, uid in chain if v < version and f"{v}_{uid}.zip" in files]
    if based_on:
        base, base_id = based_on[-1]
        needed = _zip_and_immutables(files, f"{base}_{base_id}.zip", version, reader)
    elif chain[0][0] == 1:
        base, needed = 0, []
    else:
        raise CheckpointChanged(
            f"state file {chain[0][0]}_{chain[0][1]}.zip (base snapshot of the lineage of {changelog}) "
            f"needed for state version {version} is missing"
        )
    after = [(v, uid) for v, uid in chain if v > base]
    if [v for v, _ in after] != list(range(base + 1, version + 1)):
        raise CheckpointError(f"{changelog}: lineage {chain} does not cover versions {base + 1}..{version}")
    needed += [_require(files, f"{v}_{uid}.changelog", version) for v, uid in after]
    return needed


def _read(read: Read, name: str, version: int) -> bytes:
    try:
        return read(name)
    except FileNotFoundError as e:
        raise CheckpointChanged(f"state file {name} needed for state version {version} vanished") from e


def _zip_and_immutables(files: Mapping[str, int], zip_name: str, version: int, reader: _Zips) -> list[str]:
    """The zip plus the SST and log files its `metadata` entry lists, checked against their sizes."""
    _require(files, zip_name, version)
    listed = reader.files(zip_name, version)
    for name, size in listed:
        _require(files, name, version)
        if files[name] != size:
            raise CheckpointChanged(
                f"state file {name} (listed by {zip_name}, state version {version}) has "
                f"{files[name]} bytes, the zip expects {size}"
            )
    return [zip_name, *(name for name, _ in listed)]


# ---------------------------------------------------------------- changelog header (format v2 lineage)


def _changelog_lineage(data: bytes, name: str) -> list[tuple[int, str]]:
    """The lineage `writeUTF`-ed after the version string at the head of a v3/v4 changelog."""
    stream = _ByteStream(_decompressed_blocks(data, name))
    version_str = stream.read_utf()
    if version_str not in ("v3", "v4"):
        raise CheckpointError(f"{name}: changelog version {version_str!r} carries no lineage")
    lineage = json.loads(stream.read_utf())
    return [(int(item["version"]), str(item["checkpointUniqueId"])) for item in lineage]


class _ByteStream:
    """Reads Java DataOutputStream `writeUTF` strings from lazily decompressed blocks."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks = blocks
        self._buffer = b""

    def _take(self, n: int) -> bytes:
        while len(self._buffer) < n:
            block = next(self._blocks, None)
            if block is None:
                raise CheckpointError("changelog ends inside its header")
            self._buffer += block
        taken, self._buffer = self._buffer[:n], self._buffer[n:]
        return taken

    def read_utf(self) -> str:
        (length,) = struct.unpack(">H", self._take(2))
        # Java's modified UTF-8 equals UTF-8 for the ASCII JSON and version strings written here.
        return self._take(length).decode("utf-8", errors="replace")


_LZ4_MAGIC = b"LZ4Block"
_OTHER_CODECS = {b"\x82SNAPPY\x00": "snappy", b"\x28\xb5\x2f\xfd": "zstd", b"ZV": "lzf"}


def _decompressed_blocks(data: bytes, name: str) -> Iterator[bytes]:
    """Blocks of lz4-java's LZ4BlockOutputStream (Spark's default state store codec `lz4`): per block
    the magic, a token (method in the high nibble: 0x10 raw, 0x20 LZ4), little-endian compressed and
    original lengths and a checksum, then the block."""
    if not data.startswith(_LZ4_MAGIC):
        codec = next((c for magic, c in _OTHER_CODECS.items() if data.startswith(magic)), "unknown")
        raise CheckpointError(
            f"{name}: changelog compressed with {codec}; only lz4 (the default "
            "spark.sql.streaming.stateStore.compression.codec) can be read to follow the v2 lineage"
        )
    pos = 0
    while pos + 21 <= len(data) and data.startswith(_LZ4_MAGIC, pos):
        token = data[pos + 8]
        compressed, original = struct.unpack_from("<ii", data, pos + 9)
        body = data[pos + 21 : pos + 21 + compressed]
        pos += 21 + compressed
        if original == 0:
            return
        yield body if token & 0xF0 == 0x10 else _lz4_block(body, original)


def _lz4_block(src: bytes, original: int) -> bytes:
    """Decode one raw LZ4 block (sequences of literals and back-references)."""
    out = bytearray()
    i = 0
    while i < len(src):
        token = src[i]
        i += 1
        literals, i = _lz4_length(src, i, token >> 4)
        out += src[i : i + literals]
        i += literals
        if i >= len(src):  # the last sequence has literals only
            break
        offset = src[i] | src[i + 1] << 8
        i += 2
        match, i = _lz4_length(src, i, token & 0x0F)
        match += 4
        start = len(out) - offset
        if offset == 0 or start < 0:
            raise CheckpointError("corrupt LZ4 block in changelog")
        while match > 0:  # the reference may overlap the bytes it produces
            chunk = out[start : start + min(match, offset)]
            out += chunk
            start += len(chunk)
            match -= len(chunk)
    if len(out) != original:
        raise CheckpointError(f"corrupt LZ4 block in changelog: {len(out)} bytes, expected {original}")
    return bytes(out)


def _lz4_length(src: bytes, i: int, length: int) -> tuple[int, int]:
    if length == 15:
        while True:
            extra = src[i]
            i += 1
            length += extra
            if extra != 255:
                break
    return length, i
