"""Storage on HDFS (`hdfs://nameservice/path`, `hdfs://host:port/path`) over WebHDFS, the NameNode's HTTP API,
through fsspec's WebHDFS filesystem.

Why this client: WebHDFS needs nothing but HTTP on the machine that runs the engine (an Airflow worker, a
laptop, the Spark driver), where Arrow's HDFS filesystem needs Hadoop's native libhdfs (no wheel ships it, and
Debian packages none) plus a JVM with Hadoop's jars loaded into every engine process. fsspec is the filesystem
layer pandas, Dask and Arrow's Python side build on, released monthly; its WebHDFS speaks simple
authentication, delegation tokens and data-node redirects. Where it answers less than the engine needs, the
engine checks: a RENAME that HDFS refuses (its destination exists) answers `false` without an error, so
`create` looks at the outcome itself.

Where the NameNode's web endpoint is, and as whom: core/hadoop_conf.py (HADOOP_CONF_DIR, as spark-submit).
For an HA nameservice the first NameNode that answers as active is used for the life of this object.

Writes are atomic for the reader the way Spark's own checkpoint files are: the bytes go to a hidden temporary
file beside the key (`.<name>.<random>.tmp`, which the snapshot engine never copies), then one RENAME puts it
in place (HDFS renames atomically). HDFS's plain rename never replaces a file: replacing an existing key is a
delete and a rename, so a reader may miss it for a moment. hdfs:// locations hold checkpoints and sinks, which
the engine writes only where no query runs; the snapshot store, whose records are replaced while others read
them and whose lease needs compare-and-swap (which WebHDFS does not offer), must be on S3 or a local path:
`replace` and `delete_if` refuse."""

from __future__ import annotations

import hashlib
import logging
import posixpath
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import hadoop_conf
from ..errors import Conflict, InvalidInput, Refused, StoreUnavailable
from ..parallel import chunked, run_parallel
from .base import ObjectInfo, Storage, check_key

log = logging.getLogger(__name__)

STORE_REFUSAL = (
    "hdfs:// holds checkpoints and sinks, not a snapshot store: a store's lease needs compare-and-swap writes, "
    "which HDFS's WebHDFS does not offer. Put the store on S3 (s3://bucket/prefix) or a local path"
)


def _filesystem(address: str, user: str) -> Any:
    from fsspec.implementations.webhdfs import WebHDFS  # the [hdfs] extra; imported only for hdfs:// locations

    host, _, port = address.rpartition(":")
    return WebHDFS(host, port=int(port), user=user)


class HdfsStorage(Storage):
    def __init__(self, authority: str, root: str, addresses: list[str] | None = None, user: str | None = None) -> None:
        """`authority`: what the URI names (a nameservice or host:port); `root`: an absolute path. The NameNode
        web `addresses` and the `user` come from the Hadoop configuration unless given."""
        conf = hadoop_conf.load()
        self.authority = authority
        self.root = "/" + root.strip("/") if root.strip("/") else "/"
        self.uri = f"hdfs://{authority}{self.root}".rstrip("/") if self.root != "/" else f"hdfs://{authority}"
        if addresses is None:
            conf.check_supported(self.uri)
            addresses = conf.namenode_http_addresses(authority)
        self.addresses = addresses
        self.user = user or conf.user
        self._active: str | None = None

    # -- the client

    @property
    def fs(self) -> Any:
        """fsspec's WebHDFS on the active NameNode (one instance per thread: fsspec caches them so)."""
        if self._active is None:
            self._active = self._find_active()
        return _filesystem(self._active, self.user)

    def _find_active(self) -> str:
        problems = []
        for address in self.addresses:
            try:
                with self._errors("reach"):
                    _filesystem(address, self.user).info("/")
                return address
            except StoreUnavailable as exc:  # a standby NameNode answers with a StandbyException
                problems.append(f"{address}: {exc}")
        raise StoreUnavailable(
            f"no NameNode of {self.uri} answers over WebHDFS ({'; '.join(problems)}): check that HDFS runs and that "
            f"HADOOP_CONF_DIR names its NameNodes' web addresses (dfs.namenode.http-address)"
        )

    @contextmanager
    def _errors(self, action: str, key: str = "") -> Iterator[None]:
        import requests

        where = f"{self.uri}/{key}" if key else self.uri
        try:
            yield
        except FileNotFoundError:
            raise
        except PermissionError as exc:
            raise StoreUnavailable(f"HDFS refused to {action} {where} for user {self.user}: {exc}") from None
        except requests.ConnectionError:
            raise StoreUnavailable(
                f"cannot reach the NameNode's WebHDFS endpoint to {action} {where} (tried {', '.join(self.addresses)}):"
                " check that HDFS runs and that HADOOP_CONF_DIR names its web address (dfs.namenode.http-address)"
            ) from None
        except (requests.RequestException, RuntimeError, ValueError) as exc:  # fsspec's RemoteException answers
            raise StoreUnavailable(f"HDFS failed to {action} {where}: {exc}") from None

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, check_key(key))

    def _temp(self, key: str) -> str:
        directory, name = posixpath.split(self._path(key))
        return posixpath.join(directory, f".{name}.{secrets.token_hex(8)}.tmp")

    # -- reading

    def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
        # `start_after` filters here: WebHDFS's LISTSTATUS answers a directory whole, from the NameNode's memory
        directory, _, _ = prefix.rpartition("/")
        start = posixpath.join(self.root, directory) if directory else self.root
        yield from (info for info in self._walk(start) if info.key.startswith(prefix) and info.key > start_after)

    def _walk(self, directory: str) -> Iterator[ObjectInfo]:
        try:
            with self._errors("list", directory):
                entries = self.fs.ls(directory, detail=True)
        except FileNotFoundError:  # gone meanwhile (Spark's cleanup), or never there
            return
        for entry in sorted(entries, key=lambda e: e["pathSuffix"]):
            path = posixpath.join(directory, entry["pathSuffix"])
            if entry["type"] == "directory":
                yield from self._walk(path)
            elif entry["type"] == "file":
                key = posixpath.relpath(path, self.root)
                yield ObjectInfo(key, int(entry["length"]), entry["modificationTime"] / 1000)

    def children(self, prefix: str) -> list[str]:
        directory = posixpath.join(self.root, prefix.strip("/")) if prefix.strip("/") else self.root
        try:
            with self._errors("list", directory):
                entries = self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return []
        return sorted(
            e["pathSuffix"] for e in entries if e["type"] == "directory" and not e["pathSuffix"].startswith(".")
        )

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            with self._errors("read", key):
                info = self.fs.info(self._path(key))
        except FileNotFoundError:
            return None
        if info["type"] != "file":
            return None
        return ObjectInfo(key, int(info["length"]), info["modificationTime"] / 1000)

    def read(self, key: str) -> bytes:
        with self._errors("read", key):
            return bytes(self.fs.cat_file(self._path(key)))

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with self._errors("read", key):
            return bytes(self.fs.cat_file(self._path(key), start=start, end=start + length))

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        data = self.read(key)
        return data, hashlib.sha256(data).hexdigest()

    def download(self, key: str, path: Path, size: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors("download", key):
            self.fs.get_file(self._path(key), str(path))

    # -- writing

    def write(self, key: str, data: bytes) -> None:
        temp = self._temp(key)
        with self._errors("write", key), self.fs.open(temp, "wb") as handle:
            handle.write(data)
        self._place(temp, key, replace=True)

    def upload(self, path: Path, key: str) -> None:
        temp = self._temp(key)
        with self._errors("upload to", key):
            self.fs.put_file(str(path), temp)
        self._place(temp, key, replace=True)

    def create(self, key: str, data: bytes) -> str:
        temp = self._temp(key)
        with self._errors("write", key), self.fs.open(temp, "wb") as handle:
            handle.write(data)
        self._place(temp, key, replace=False)
        return hashlib.sha256(data).hexdigest()

    def _place(self, temp: str, key: str, *, replace: bool) -> None:
        """RENAME the complete temporary file to `key` (atomic on HDFS). HDFS never renames onto an existing
        file and answers `false`, which fsspec does not raise: the temporary file still being there says so."""
        target = self._path(key)
        try:
            with self._errors("write", key):
                if replace and self.fs.exists(target):
                    self.fs.rm(target)
                self.fs.mv(temp, target)
                if not self.fs.exists(temp):
                    return
        except BaseException:
            self._discard(temp)
            raise
        self._discard(temp)
        if replace:
            raise StoreUnavailable(f"HDFS did not rename the new content of {self.uri}/{key} into place; retry")
        raise Conflict(f"{self.uri}/{key} already exists: someone else created it first")

    def _discard(self, temp: str) -> None:
        try:
            self.fs.rm(temp)
        except (FileNotFoundError, OSError, RuntimeError) as exc:
            log.debug("leftover temporary file %s: %s", temp, exc)

    def replace(self, key: str, data: bytes, token: str) -> str:
        raise Refused(f"{self.uri}/{key}: {STORE_REFUSAL}")

    def delete_if(self, key: str, token: str) -> bool:
        raise Refused(f"{self.uri}/{key}: {STORE_REFUSAL}")

    def delete(self, keys: Iterable[str]) -> int:
        def delete_chunk(chunk: list[str]) -> int:
            for key in chunk:
                try:
                    with self._errors("delete", key):
                        self.fs.rm(self._path(key))
                except FileNotFoundError:
                    pass
            return len(chunk)

        return sum(run_parallel(delete_chunk, chunked(keys, 64), concurrency=8))

    def child(self, prefix: str) -> HdfsStorage:
        child = HdfsStorage(self.authority, self._path(prefix.strip("/")), self.addresses, self.user)
        child._active = self._active
        return child


def parse(uri: str, authority: str, path: str) -> HdfsStorage:
    """An `hdfs://` URI's storage; the authority is required (Hadoop's default FS is not guessed)."""
    if not authority:
        raise InvalidInput(f"malformed HDFS URI {uri!r}: name the NameNode or nameservice, hdfs://namenode:8020/path")
    if path.strip("/"):
        check_key(path.strip("/"))
    return HdfsStorage(authority, path)
