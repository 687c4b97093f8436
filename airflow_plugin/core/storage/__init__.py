"""Where bytes live: local directories, S3 prefixes and HDFS directories behind one interface, opened from a URI."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..errors import InvalidInput
from . import hdfs
from .base import Digest, ObjectInfo, Storage, check_key, copy_and_hash, sha256_file
from .hdfs import HdfsStorage
from .local import LocalStorage
from .s3 import S3Settings, S3Storage

__all__ = [
    "Digest",
    "HdfsStorage",
    "LocalStorage",
    "ObjectInfo",
    "S3Settings",
    "S3Storage",
    "Storage",
    "check_key",
    "copy_and_hash",
    "open_storage",
    "sha256_file",
    "spark_uri",
]

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def open_storage(uri: str, s3: S3Settings | None = None) -> Storage:
    """A local path, `file:///path` (or Hadoop's `file:/path`), `s3://bucket/prefix`, `s3a://...` or
    `hdfs://namenode/path` (checkpoints and sinks only: storage/hdfs.py)."""
    if not uri or not uri.strip():
        raise InvalidInput("empty location: give a local path, s3://bucket/prefix or hdfs://namenode/path")
    uri = uri.strip()
    if "://" not in uri and not uri.startswith("file:"):
        return LocalStorage(Path(uri).expanduser())
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidInput(f"malformed file URI {uri!r}: use file:///absolute/path")
        return LocalStorage(Path(unquote(parsed.path)))
    if scheme in ("s3", "s3a"):
        bucket = parsed.netloc
        if parsed.username or parsed.password or "@" in bucket:
            raise InvalidInput("malformed S3 URI: credentials do not belong in the URI; use the environment")
        if not _BUCKET.match(bucket):
            raise InvalidInput(f"malformed S3 URI {uri!r}: expected s3://bucket/prefix with a valid bucket name")
        prefix = parsed.path.strip("/")
        if prefix:
            check_key(prefix)
        return S3Storage(bucket, prefix, s3)
    if scheme == "hdfs":
        return hdfs.parse(uri, parsed.netloc, unquote(parsed.path))
    raise InvalidInput(f"unsupported location {uri!r}: use a local path, file://, s3://, s3a:// or hdfs://")


def spark_uri(storage: Storage) -> str:
    """How Spark itself spells a location (Hadoop-qualified): `file:/abs/path`, `s3a://bucket/prefix` or
    `hdfs://namenode/path`."""
    if isinstance(storage, S3Storage):
        return f"s3a://{storage.bucket}/{storage.prefix}".rstrip("/")
    if isinstance(storage, HdfsStorage):
        return storage.uri
    return f"file:{storage.uri}"
