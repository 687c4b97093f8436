"""The stored contents of snapshots, behind one interface: every reader and writer of file contents (create,
restore, verify, the sink log a restore rewinds with, delete, garbage collection, repack) goes through here.

Store format 2 (restic's and git's answer to small files): a content up to `PackSettings.threshold` bytes (a
file the store's S3 copies itself: up to `copy_threshold`) is appended to a pack, an object of about
`target_size` bytes holding many contents back to back (no header: a byte range of a pack IS the file); a larger
content stays one object, `blobs/<sha[:2]>/<sha>`. The
manifest says per file which object holds it and at which offset (manifest.py `FileEntry.key`, `.offset`),
so reading needs no index. Contents are still stored once: a create looks a content up by checksum in the
job's earlier snapshots, whichever pack holds it.

The store's `format.json` records the format and the packing settings. The first create in a store writes it;
a store of a format this code does not know is refused (each manifest carries its own version too:
records/manifest.py)."""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..errors import Conflict, IntegrityError, Refused
from ..layout import FORMAT, blob_key, pack_key, staging_key
from ..parallel import DEFAULT_CONCURRENCY, run_parallel
from ..records.manifest import FileEntry
from ..storage import S3Storage, Storage

STORE_FORMAT = 2
KiB = 1024
MiB = 1024 * KiB
MAX_GAP = 256 * 1024  # two ranges of one pack closer than this are read as one request
MAX_READ = 8 * MiB  # ... up to this many bytes a request (memory: concurrency x MAX_READ at most)
MAX_ENTRIES = 256  # ... and this many files: the files of one request are handled by one thread
IN_MEMORY = 8 * MiB  # contents up to this size are read into memory; larger ones stream to a file

R = TypeVar("R")


@dataclass(frozen=True)
class PackSettings:
    """How a store packs small contents (kept in the store's format.json: one setting for every writer)."""

    threshold: int = 1 * MiB  # contents up to this size go into packs; larger ones stay single objects
    target_size: int = 8 * MiB  # a pack is written once it holds this much
    # ... but a file the store's S3 can copy itself (a checkpoint on the same S3) is packed only up to this size:
    # a packed file's bytes come down to the engine and go up again, a copy moves none through it (at 1 MiB,
    # 12 to 40% of a live savepoint's bytes passed through the engine: docs/benchmarks.md, `make bench-scale`)
    copy_threshold: int = 64 * KiB

    def __post_init__(self) -> None:
        if not 0 <= self.threshold <= IN_MEMORY or self.target_size < 1 or self.copy_threshold < 0:
            raise Refused(
                f"format.json: pack_threshold must be 0..{IN_MEMORY} bytes, pack_size positive and copy_threshold "
                f"0 or more; got {self.threshold}, {self.target_size}, {self.copy_threshold}: fix or delete the "
                "store's format.json"
            )


@dataclass(frozen=True)
class Read:
    """One request: `length` bytes of object `key` from `start`, holding these entries (a plan, as data)."""

    key: str
    start: int
    length: int
    entries: tuple[FileEntry, ...] = field(default=())


def plan_reads(
    entries: Iterable[FileEntry], max_gap: int = MAX_GAP, max_read: int = MAX_READ, max_entries: int = MAX_ENTRIES
) -> list[Read]:
    """The fewest requests that read `entries` (each up to IN_MEMORY bytes): per object, the byte ranges
    sorted and merged where the gap between them is small, up to `max_read` bytes and `max_entries` files a
    request (a whole pack of thousands of tiny files would otherwise be written out by one thread)."""
    by_key: dict[str, list[FileEntry]] = {}
    for entry in entries:
        by_key.setdefault(entry.key, []).append(entry)
    reads: list[Read] = []
    for key, group in by_key.items():
        group.sort(key=lambda e: (e.offset, e.size))
        start, end, members = group[0].offset, group[0].offset + group[0].size, [group[0]]
        for entry in group[1:]:
            entry_end = entry.offset + entry.size
            fits = len(members) < max_entries and max(end, entry_end) - start <= max_read
            if entry.offset - end <= max_gap and fits:
                end = max(end, entry_end)
                members.append(entry)
                continue
            reads.append(Read(key, start, end - start, tuple(members)))
            start, end, members = entry.offset, entry_end, [entry]
        reads.append(Read(key, start, end - start, tuple(members)))
    return reads


def checksum_problem(entry: FileEntry, data: bytes | None) -> str | None:
    """Why `data` is not the content of `entry` (None: it is)."""
    if data is None:
        return f"{entry.path}: stored content {entry.key} is missing"
    if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
        return f"{entry.path}: checksum mismatch (stored content {entry.key} {entry.byte_range} is corrupt)"
    return None


class Blobs:
    """The contents of one store."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    # ------------------------------------------------------------ format

    def settings(self) -> PackSettings:
        """The store's packing settings (defaults when it has no format.json yet)."""
        try:
            raw = json.loads(self.storage.read(FORMAT))
        except FileNotFoundError:
            return PackSettings()
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            raise IntegrityError(f"{self.storage.uri}/{FORMAT} is not a JSON object: fix it or delete it")
        version = raw.get("format_version")
        if version != STORE_FORMAT:
            fix = "upgrade savepoints" if isinstance(version, int) and version > STORE_FORMAT else "use a new store"
            raise Refused(
                f"store {self.storage.uri} has format {version!r}; this savepoints knows format {STORE_FORMAT} "
                f"only: {fix}"
            )
        default = PackSettings()
        try:
            return PackSettings(
                int(raw.get("pack_threshold", default.threshold)),
                int(raw.get("pack_size", default.target_size)),
                int(raw.get("copy_threshold", default.copy_threshold)),
            )
        except (TypeError, ValueError):
            raise Refused(
                f"{self.storage.uri}/{FORMAT}: pack_threshold, pack_size and copy_threshold must be numbers of bytes"
            ) from None

    def init_format(self, settings: PackSettings | None = None) -> PackSettings:
        """Write format.json unless there is one (the first create of a store);
        with `settings`, write those (how an operator or a test changes the packing)."""
        if self.storage.stat(FORMAT) is not None and settings is None:
            return self.settings()
        settings = settings or PackSettings()
        document = {"format_version": STORE_FORMAT, "pack_threshold": settings.threshold}
        document |= {"pack_size": settings.target_size, "copy_threshold": settings.copy_threshold}
        self.storage.write(FORMAT, json.dumps(document).encode())
        return settings

    # ------------------------------------------------------------ write

    def writer(self) -> BlobWriter:
        return BlobWriter(self.storage, self.init_format())

    # ------------------------------------------------------------ read

    def read_each(
        self,
        entries: Iterable[FileEntry],
        handle: Callable[[FileEntry, bytes | None], R],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> Iterator[R]:
        """`handle(entry, content)` for every entry (content None: its object is missing), in worker threads
        right after each request, so that no more than `concurrency` requests' bytes are held at once.
        Entries must be up to IN_MEMORY bytes; content is as stored (the caller checks it)."""

        def one(read: Read) -> list[R]:
            try:
                data: bytes | None = self.storage.read_range(read.key, read.start, read.length)
            except FileNotFoundError:
                data = None
            results = []
            for entry in read.entries:
                at = entry.offset - read.start
                results.append(handle(entry, None if data is None else data[at : at + entry.size]))
            return results

        entries = list(entries)
        too_large = next((e for e in entries if e.size > IN_MEMORY), None)
        if too_large is not None:
            raise ValueError(f"{too_large.path} ({too_large.size} bytes) is too large to read into memory")
        for entry in entries:
            if entry.size == 0:
                yield handle(entry, b"")
        for results in run_parallel(one, plan_reads(e for e in entries if e.size), concurrency=concurrency):
            yield from results

    def read(self, entry: FileEntry) -> bytes:
        """One content, checked against its checksum."""
        [data] = self.read_each([entry], lambda _, content: content, concurrency=1)
        problem = checksum_problem(entry, data)
        if problem or data is None:
            raise IntegrityError(f"{problem}: restore another snapshot and run `savepoints verify`")
        return data

    def download(self, entry: FileEntry, path: Path) -> None:
        """A content that is its own object, to a local file (streamed; the caller checks it)."""
        self.storage.download(entry.key, path, size=entry.size)

    # ------------------------------------------------------------ delete

    def delete(self, keys: Iterable[str]) -> int:
        return self.storage.delete(keys)


class BlobWriter:
    """Stores the new contents of one create attempt (thread-safe): small ones appended to the open pack,
    which is written once it reaches the target size; large ones as their own object. `flush` writes the
    last pack: call it before the manifest that references any of them."""

    def __init__(self, storage: Storage, settings: PackSettings) -> None:
        self.storage, self.settings = storage, settings
        self.lock = threading.Lock()
        self._key = pack_key(secrets.token_hex(16))
        self._buffer = bytearray()
        self.packs = 0
        # whether the store's S3 says the SHA-256 of a copy (None: not yet known); False after a staging copy
        # came back without one (S3Proxy), so that no later file of this create pays for a staging copy
        self.copies_checksummed: bool | None = None
        self.learning = threading.Lock()  # held by the one file that learns `copies_checksummed`
        # whether the store's S3 refuses a copy whose CopySourceIfMatch fails (None: not probed yet): then a copy
        # made on that condition holds the version the condition names, without a HEAD of the copy to tell
        self._conditional: bool | None = None
        self._probe = threading.Lock()

    def fits_pack(self, size: int, source: Storage) -> bool:
        """Small files of `source` are read into memory and packed; any larger one goes through `put_large` or
        is copied within S3 (`copies_from`), which packs fewer of them (`PackSettings.copy_threshold`)."""
        limit = self.settings.threshold
        if self.copies_from(source, size) is not None:
            limit = min(limit, self.settings.copy_threshold)
        return size <= limit

    def append(self, data: bytes) -> tuple[str, int, tuple[str, bytes] | None]:
        """Append `data` to the open pack: (pack key, offset, a full pack to `write` or None). No I/O, so a
        caller may hold its own lock around deciding and appending."""
        with self.lock:
            key, offset = self._key, len(self._buffer)
            self._buffer += data
            sealed = self._seal() if len(self._buffer) >= self.settings.target_size else None
        return key, offset, sealed

    def write(self, sealed: tuple[str, bytes] | None) -> None:
        if sealed:
            self.storage.write(*sealed)

    def put_large(self, sha256: str, path: Path) -> None:
        """Store one large content as its own object, from a local file (multipart where the backend has it)."""
        self.storage.upload(path, blob_key(sha256))

    # -- server-side copies (a checkpoint on the store's S3): S3 moves the bytes and computes their checksum

    def copies_from(self, source: Storage, size: int) -> S3Storage | None:
        """The store as an S3Storage that can copy this file from `source` itself, or None."""
        store = self.storage
        return store if isinstance(store, S3Storage) and store.copies_within(source, size) else None

    def copy_known(self, store: S3Storage, source: S3Storage, key: str, sha256: str, etag: str) -> bool:
        """Copy the version `etag` of a file whose SHA-256 S3 told with that ETag (`S3Storage.checksummed`) to its
        blob; False (and nothing left) when what was copied is another version: the file was replaced since."""
        target = blob_key(sha256)
        try:
            if self.copy_version(store, source, key, target, etag, sha256) == sha256:
                return True
        except Conflict:  # the condition failed: nothing was copied
            return False
        store.delete([target])
        return False

    def copy_version(
        self, store: S3Storage, source: S3Storage, key: str, target: str, etag: str, sha256: str
    ) -> str | None:
        """Copy `key` to `target` on the condition that it still is version `etag`, whose SHA-256 is `sha256`:
        the SHA-256 the copy holds, as S3's answer says it, else as the condition guarantees it on a server
        that honours it (probed once a create, after the first answer without a checksum: SeaweedFS and S3Proxy
        give none), else as the copy's HEAD says it (None: the server keeps none). A source that is no longer
        that version raises Conflict where the server honours the condition."""
        said = store.copy(source, key, target, if_match=etag)
        if said is not None:
            return said
        with self._probe:
            if self._conditional is None:  # a probe that is not refused copies again: the HEAD below sees that copy
                self._conditional = store.honours_copy_condition(source, key, target, etag)
        return sha256 if self._conditional else store.sha256(target)[0]

    def stage(self, store: S3Storage, source: S3Storage, key: str) -> tuple[str, str | None, int]:
        """Copy a file to a staging object, S3 computing its SHA-256: (staging key, checksum or None from a
        service that computes none, size). The caller `promote`s it or deletes it; one a killed create
        leaves behind is an unreferenced object under blobs/, which garbage collection removes."""
        staged = staging_key(secrets.token_hex(16))
        sha256 = store.copy_from(source, key, staged)
        info = store.stat(staged)
        return staged, sha256, info.size if info else -1

    def promote(self, store: S3Storage, staged: str, sha256: str) -> None:
        """Copy a staged content to its blob, S3's checksum of the copy checked again."""
        if store.copy_from(store, staged, blob_key(sha256)) != sha256:
            store.delete([blob_key(sha256)])
            raise IntegrityError(f"{store.uri}/{staged}: S3 copied it with another checksum than it computed before")

    def flush(self) -> None:
        with self.lock:
            sealed = self._seal() if self._buffer else None
        self.write(sealed)

    def _seal(self) -> tuple[str, bytes]:
        sealed = (self._key, bytes(self._buffer))
        self._key, self._buffer = pack_key(secrets.token_hex(16)), bytearray()
        self.packs += 1
        return sealed
