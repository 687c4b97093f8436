"""Storage on the local filesystem (also `file://` URIs).

Conditional writes: `create` writes a private temp file completely, then hard-links it to the key
(os.link fails if the key exists), so the key never exists half-written and only one creator wins.
`replace` and `delete_if` compare and swap under an exclusive flock of the key's DIRECTORY (a lock
file beside the key would have to stay forever: removing one that others may be waiting on would let two
lockers in); the swap itself is a rename, so readers (who take no lock) see the old or the new content.
The token (`ObjectInfo.version`) is the inode, mtime and size of the file: every write renames a new file
into place, so it names one write, even of the same bytes, and a listing's stat shows it."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import Conflict
from ..parallel import chunked, run_parallel
from .base import ObjectInfo, Storage, check_key


def version_of(st: os.stat_result) -> str:
    """The token of the file `st` describes: which write put it there (a new inode each time)."""
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


class LocalStorage(Storage):
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def local_path(self, key: str) -> Path:
        return self._path(key)

    def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
        # Walk only the deepest directory the prefix names, then filter by the rest of the prefix (and stat only
        # the files after `start_after`).
        directory, _, _ = prefix.rpartition("/")
        start = self.root / directory if directory else self.root
        if not start.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in sorted(filenames):
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not key.startswith(prefix) or key <= start_after:
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:  # deleted between listing and stat (Spark cleanup)
                    continue
                yield ObjectInfo(key, st.st_size, st.st_mtime, version_of(st))

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self._path(key).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime, version_of(st))

    def children(self, prefix: str) -> list[str]:
        directory = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        try:
            return sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = _complete_temp_file(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def create(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp = _complete_temp_file(path, data)
        try:
            written = tmp.stat()
            os.link(tmp, path)  # atomic, and fails if the key exists: the content is complete when it appears
        except FileExistsError:
            raise Conflict(f"{self.uri}/{key} already exists: someone else created it first") from None
        finally:
            tmp.unlink(missing_ok=True)
        return version_of(written)

    def replace(self, key: str, data: bytes, token: str) -> str:
        path = self._path(key)
        with _locked(path):
            self._check_token(path, key, token, missing_ok=False)
            tmp = _complete_temp_file(path, data)
            try:
                written = tmp.stat()
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        return version_of(written)

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        with self._path(key).open("rb") as handle:  # the open file is the one written: its stat is its token
            return handle.read(), version_of(os.fstat(handle.fileno()))

    def delete_if(self, key: str, token: str) -> bool:
        path = self._path(key)
        with _locked(path):
            if not self._check_token(path, key, token, missing_ok=True):
                return False
            path.unlink()
        return True

    def _check_token(self, path: Path, key: str, token: str, *, missing_ok: bool) -> bool:
        """Whether `key` exists and holds the content `token` stands for; Conflict if it holds another."""
        try:
            current = version_of(path.stat())
        except FileNotFoundError:
            if missing_ok:
                return False
            raise Conflict(f"{self.uri}/{key} no longer exists: someone else deleted it") from None
        if current != token:
            raise Conflict(f"{self.uri}/{key} was changed by someone else since it was read")
        return True

    def upload(self, path: Path, key: str) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def download(self, key: str, path: Path, size: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._path(key), path)

    def delete(self, keys: Iterable[str]) -> int:
        def delete_chunk(chunk: list[str]) -> int:
            for key in chunk:
                self._path(key).unlink(missing_ok=True)
            return len(chunk)

        return sum(run_parallel(delete_chunk, chunked(keys, 256), concurrency=8))

    def child(self, prefix: str) -> LocalStorage:
        return LocalStorage(self._path(prefix.strip("/")))

    def exists(self) -> bool:
        return self.root.is_dir() and any(True for _ in self.list())


def _complete_temp_file(path: Path, data: bytes) -> Path:
    """`data` written and synced to a private temp file beside `path` (creating the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock for compare-and-swap on `path`, across threads and processes: flock of its directory
    (which leaves nothing behind)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
