"""Storage on S3 (or any S3 API such as moto, MinIO) through boto3.

Endpoint, region and credentials come from boto3's own chain (AWS_ENDPOINT_URL, AWS_PROFILE, ...)
unless `S3Settings` names them (the Airflow layer fills it from an AWS connection; the job context hands
the same settings to every location it opens: core/context.py). Transfers use
s3transfer (multipart above a threshold, retries per part); botocore retries throttling and 5xx."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import NotFound, StoreUnavailable
from ..parallel import chunked, run_parallel
from .base import CHUNK, ObjectInfo, Storage

DELETE_BATCH = 1000  # the S3 DeleteObjects limit


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None
    region_name: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    max_pool_connections: int = 64
    multipart_threshold: int = 16 * 1024 * 1024
    multipart_chunksize: int = 16 * 1024 * 1024
    max_attempts: int = 10
    connect_timeout: float = 10.0  # seconds; a blackholed endpoint fails instead of hanging
    read_timeout: float = 60.0

    def child_env(self) -> dict[str, str]:
        """The environment that gives a child process (a Spark driver) the same S3 access."""
        names = {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region_name,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_SESSION_TOKEN": self.session_token,
        }
        return {name: value for name, value in names.items() if value}


_clients: dict[tuple[S3Settings, tuple[str | None, ...]], Any] = {}
_clients_lock = threading.Lock()
# boto3's own chain reads these when a client is built: a client built under other values is another client
_CHAIN_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_MAX_ATTEMPTS",
)


def _client(settings: S3Settings) -> Any:
    """One client per settings and environment: boto3 clients are thread-safe and expensive to build."""
    key = (settings, tuple(os.environ.get(name) for name in _CHAIN_ENV))
    with _clients_lock:
        if key not in _clients:
            import boto3
            from botocore.config import Config

            session = boto3.session.Session(
                aws_access_key_id=settings.access_key_id,
                aws_secret_access_key=settings.secret_access_key,
                aws_session_token=settings.session_token,
                region_name=settings.region_name,
            )
            config = Config(
                # AWS_MAX_ATTEMPTS, boto3's own setting, wins over the default
                retries={
                    "max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS") or settings.max_attempts),
                    "mode": "standard",
                },
                max_pool_connections=settings.max_pool_connections,
                connect_timeout=settings.connect_timeout,
                read_timeout=settings.read_timeout,
            )
            _clients[key] = session.client("s3", endpoint_url=settings.endpoint_url, config=config)
        return _clients[key]


@contextmanager
def s3_errors(action: str, uri: str, bucket: str) -> Iterator[None]:
    """Translate botocore failures into errors that name the thing and the fix, without secrets."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    try:
        yield
    except (NoCredentialsError, PartialCredentialsError):
        raise StoreUnavailable(
            f"no AWS credentials to {action} {uri}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE), or give the Airflow AWS connection a login and password"
        ) from None
    except EndpointConnectionError as exc:
        endpoint = urlsplit(str(exc.kwargs.get("endpoint_url", "")))  # the endpoint, not the whole request URL
        raise StoreUnavailable(
            f"cannot reach the S3 endpoint {endpoint.scheme}://{endpoint.netloc} to {action} {uri}: "
            "check AWS_ENDPOINT_URL (or the connection's endpoint_url) and that the service is up"
        ) from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        if code in ("NoSuchKey", "404", "NotFound"):
            raise FileNotFoundError(f"{uri}: no such object") from None
        if code == "NoSuchBucket":
            raise NotFound(f"bucket {bucket!r} does not exist ({uri}): create it or fix the URI") from None
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
            raise StoreUnavailable(
                f"S3 refused to {action} {uri} ({code}): check the credentials and the bucket policy"
            ) from None
        raise StoreUnavailable(f"S3 failed to {action} {uri}: {code} {error.get('Message', '')}") from None


class S3Storage(Storage):
    def __init__(self, bucket: str, prefix: str = "", settings: S3Settings | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = settings or S3Settings()
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    @property
    def client(self) -> Any:
        return _client(self.settings)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _errors(self, action: str, key: str = "") -> AbstractContextManager[None]:
        return s3_errors(action, f"{self.uri}/{key}" if key else self.uri, self.bucket)

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=self.settings.multipart_threshold,
            multipart_chunksize=self.settings.multipart_chunksize,
            max_concurrency=4,  # per file; files themselves are transferred in parallel by the caller
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        with self._errors("list", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
                for obj in page.get("Contents", ()):
                    yield ObjectInfo(obj["Key"][len(root) :], obj["Size"], obj["LastModified"].timestamp())

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            with self._errors("read", key):
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except FileNotFoundError:
            return None
        return ObjectInfo(key, head["ContentLength"], head["LastModified"].timestamp())

    def read(self, key: str) -> bytes:
        with self._errors("read", key):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """A range past the object's end reads as empty (a truncated object is corrupt, not unreachable)."""
        from botocore.exceptions import ClientError

        with self._errors("read", key):
            try:
                response = self.client.get_object(
                    Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{start + length - 1}"
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    return b""
                raise
            return response["Body"].read()

    def write(self, key: str, data: bytes) -> None:
        with self._errors("write", key):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def upload(self, path: Path, key: str) -> None:
        with self._errors("upload to", key):
            self.client.upload_file(str(path), self.bucket, self._key(key), Config=self._transfer_config())

    def download(self, key: str, path: Path, size: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors("download", key):
            if size is not None and size < self.settings.multipart_threshold:
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
                with path.open("wb") as handle:
                    for chunk in body.iter_chunks(CHUNK):
                        handle.write(chunk)
                return
            self.client.download_file(self.bucket, self._key(key), str(path), Config=self._transfer_config())

    def delete(self, keys: Iterable[str]) -> int:
        batches = list(chunked(map(self._key, keys), DELETE_BATCH))

        def delete_batch(keys: list[str]) -> int:
            with self._errors("delete from"):
                response = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
                )
            if response.get("Errors"):
                first = response["Errors"][0]
                raise StoreUnavailable(
                    f"S3 refused to delete {len(response['Errors'])} objects in {self.uri} "
                    f"(first: {first.get('Key')}: {first.get('Code')})"
                )
            return len(keys)

        return sum(run_parallel(delete_batch, batches, concurrency=8))

    def child(self, prefix: str) -> S3Storage:
        return S3Storage(self.bucket, self._key(prefix.strip("/")), self.settings)
