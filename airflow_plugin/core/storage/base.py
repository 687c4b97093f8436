"""The one interface the engine uses for bytes at rest: a flat key space under a root (a local directory
or an S3 prefix). Keys are relative, '/'-separated, and never contain '..'."""

from __future__ import annotations

import hashlib
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInput

CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch; S3: LastModified
    # which content of the key this is, as the backend names it (S3: the ETag; local: inode, mtime and size):
    # the token conditional writes take; a listing shows it, so a listing tells which objects changed
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Digest:
    size: int
    sha256: str


def check_key(key: str) -> str:
    """Refuse keys that could escape the root: absolute, '..', empty parts, backslashes."""
    parts = key.split("/")
    if not key or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts):
        raise InvalidInput(f"unsafe relative path {key!r}: paths must be relative and must not contain '..'")
    return key


def sha256_file(path: Path) -> Digest:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return Digest(size, digest.hexdigest())


def copy_and_hash(source: Path, target: Path) -> Digest:
    """Copy a file and hash exactly the bytes written."""
    digest = hashlib.sha256()
    size = 0
    with source.open("rb") as reader, target.open("wb") as writer:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
    return Digest(size, digest.hexdigest())


class Storage(ABC):
    """A root under which objects live. Implementations map missing keys to FileNotFoundError and
    infrastructure failures to StoreUnavailable / NotFound (errors.py)."""

    uri: str  # for messages and manifests; never carries credentials

    @abstractmethod
    def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix` (recursive), keys relative to the root; with `start_after`,
        only keys that sort after it (S3: StartAfter, so that a listing of a growing directory, a Delta log, asks
        for what is new and not for all of it)."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None: ...

    @abstractmethod
    def read(self, key: str) -> bytes: ...

    @abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Replace `key` atomically: a reader sees the old or the new content, never a mix."""

    # Conditional writes: the building blocks of a lease and of the catalogs (core/catalog/index.py). A token is
    # opaque and stands for one write of `key` (S3: its ETag; local: the inode, mtime and size of the file a
    # write renamed into place); `stat` and `list` show it as `ObjectInfo.version`. Writers whose identity
    # matters write content unique to them (a nonce): S3 recognizes its own write by it when a retried
    # request whose first attempt succeeded answers 412. A lost race raises errors.Conflict (a Refused: exit
    # 4), nothing written.

    @abstractmethod
    def create(self, key: str, data: bytes) -> str:
        """Write `key` only if it does not exist (S3: If-None-Match: *); readers never see it half-written.
        Returns its token."""

    @abstractmethod
    def replace(self, key: str, data: bytes, token: str) -> str:
        """Replace `key` only if it still holds the content `token` stands for (S3: If-Match); a missing
        `key` is a Conflict too. Returns the new token."""

    @abstractmethod
    def read_with_token(self, key: str) -> tuple[bytes, str]:
        """The content of `key` and the token for exactly that content; FileNotFoundError if missing."""

    @abstractmethod
    def delete_if(self, key: str, token: str) -> bool:
        """Delete `key` only if it still holds the content `token` stands for. False if it was already gone
        (also when a retried delete had succeeded); Conflict if it holds something else."""

    def token_of(self, data: bytes) -> str | None:
        """The token a write of exactly `data` gets, where the backend derives it from the content alone (S3:
        the MD5 ETag of a single PUT), so that a conditional write can name content it never read; None where
        it does not (local: the file's inode and mtime)."""
        return None

    def read_if_changed(self, key: str, version: str) -> tuple[bytes, str] | None:
        """The content of `key` and its token, or None when it still is the content `version` stands for (S3:
        a conditional GET, answered 304 without a body). FileNotFoundError if missing."""
        info = self.stat(key)
        if info is None:
            raise FileNotFoundError(f"{self.uri}/{key}")
        return None if info.version == version else self.read_with_token(key)

    @abstractmethod
    def children(self, prefix: str) -> list[str]:
        """The names directly under `prefix` (which ends with '/') that have objects below them, sorted: one
        request per thousand names on S3 (a delimited listing), whatever lies deeper."""

    @abstractmethod
    def upload(self, path: Path, key: str) -> None:
        """Copy a local file to `key` (multipart for large files where the backend has it)."""

    @abstractmethod
    def download(self, key: str, path: Path, size: int | None = None) -> None:
        """Copy `key` to a local file, creating parent directories. A known `size` lets a backend skip
        asking for it (one request instead of two for small objects)."""

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> int:
        """Delete keys (missing ones are fine); returns how many were asked for."""

    @abstractmethod
    def child(self, prefix: str) -> Storage:
        """The storage rooted at `prefix` below this root."""

    @contextmanager
    def fetched(self, key: str) -> Iterator[Path]:
        """A local file with the object's content: the file itself for local storage, else a temporary
        download removed afterwards. A missing object raises FileNotFoundError (maybe only on open)."""
        local = self.local_path(key)
        if local is not None:
            yield local
            return
        with tempfile.TemporaryDirectory(prefix="savepoints-") as tmp:
            path = Path(tmp) / "object"
            self.download(key, path)
            yield path

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes of `key` from byte `start` (one ranged request where the backend has them)."""
        with self.fetched(key) as local, local.open("rb") as handle:
            handle.seek(start)
            return handle.read(length)

    def local_path(self, key: str) -> Path | None:
        """The file behind `key` when this storage is a local directory (lets copies skip a temp file)."""
        return None

    def exists(self) -> bool:
        """Whether anything at all lives under the root."""
        return next(iter(self.list()), None) is not None

    def __str__(self) -> str:
        return self.uri
