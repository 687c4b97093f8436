"""Storage on the local filesystem (also `file://` URIs)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..parallel import chunked, run_parallel
from .base import ObjectInfo, Storage, check_key


class LocalStorage(Storage):
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def local_path(self, key: str) -> Path:
        return self._path(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Walk only the deepest directory the prefix names, then filter by the rest of the prefix.
        directory, _, _ = prefix.rpartition("/")
        start = self.root / directory if directory else self.root
        if not start.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in sorted(filenames):
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:  # deleted between listing and stat (Spark cleanup)
                    continue
                yield ObjectInfo(key, st.st_size, st.st_mtime)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self._path(key).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def read(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

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
