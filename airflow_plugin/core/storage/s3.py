"""Storage on S3 (or any S3 API such as moto, MinIO) through boto3.

Endpoint, region and credentials come from boto3's own chain (AWS_ENDPOINT_URL, AWS_PROFILE, ...)
unless `S3Settings` names them (the Airflow layer fills it from an AWS connection; the job context hands
the same settings to every location it opens: core/jobs/context.py).

Retries are the libraries': botocore's retry mode (`standard`, or AWS_RETRY_MODE; AWS_MAX_ATTEMPTS)
retries throttling, 5xx, connection errors and truncated XML answers up to the response headers of a
GET; every GET goes through s3transfer's download, which also retries a response body that breaks while
it is read (reset, truncated, timed out) -- `get_object()['Body'].read()` alone would not be retried.
Downloads skip the HEAD request s3transfer would otherwise send first: with response checksum
validation `when_required` it starts with one ranged GET that tells it the size (the engine checks the
SHA-256 of every stored file itself)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from ..errors import Conflict, InvalidInput, NotFound, Refused, StoreUnavailable
from ..parallel import chunked, run_parallel
from .base import ObjectInfo, Storage

DELETE_BATCH = 1000  # the S3 DeleteObjects limit
# CopyObjects within S3 run this many times as many at once as transfers through the client: a copy costs the client
# a request and no bytes (`copy_concurrency`)
COPY_CONCURRENCY = 4
S3A = "spark.hadoop.fs.s3a"  # the prefix of Hadoop S3A settings as Spark conf
MAX_COPY = 5 * 1024**3  # the largest object one CopyObject copies (UploadPartCopy above it)


@dataclass(frozen=True)
class Checksummed:
    """What one HEAD says of an object: the SHA-256 S3 keeps of it (hex; None: it keeps none), size, ETag."""

    sha256: str | None
    size: int
    etag: str


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None
    region_name: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    # connections to S3 at once: the copies within S3 and the transfers that run beside them (`copy_concurrency`)
    max_pool_connections: int = 128
    multipart_threshold: int = 16 * 1024 * 1024
    multipart_chunksize: int = 16 * 1024 * 1024
    max_attempts: int = 10  # in all, the first included (as AWS_MAX_ATTEMPTS counts)
    connect_timeout: float = 10.0  # seconds; a blackholed endpoint fails instead of hanging
    read_timeout: float = 60.0
    # a boto3 session its caller made (the Airflow layer: the Amazon provider's, from an AWS connection): its
    # credentials, refreshed as it refreshes them (an assumed role), instead of the keys above
    session: Any = field(default=None, repr=False)
    temporary: bool = False  # those credentials expire (an assumed role, web identity, a session token)
    drivers_own_identity: bool = False  # a long-lived driver uses its machine's identity (instance profile, IRSA)

    def child_env(self, *, lasting: bool = False) -> dict[str, str]:
        """The environment that gives a child process the same S3 access. `lasting`: a deployment's driver, which
        runs for weeks: it gets keys that do not expire, or none (its own identity); credentials that would expire
        under it are refused. A short-lived Spark tool (a pre-flight, a rescale) gets a session's current ones."""
        keys = (self.access_key_id, self.secret_access_key, self.session_token)
        if self.session is not None:
            if self.temporary and lasting and not self.drivers_own_identity:
                raise Refused(
                    "the AWS connection's credentials expire (an assumed role, web identity or a session token), and "
                    "a deployment's driver runs for weeks: give the drivers an identity of their own (an instance "
                    "profile, IRSA, S3A's credential providers in the job's conf) and set the connection's extra "
                    '"driver_credentials": "own", or use a connection with keys that do not expire'
                )
            keys = (None, None, None)
            if not lasting:  # a tool ends long before the session's credentials do
                frozen = self.session.get_credentials().get_frozen_credentials()
                keys = (frozen.access_key, frozen.secret_key, frozen.token)
        names = {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region_name,
            "AWS_ACCESS_KEY_ID": keys[0],
            "AWS_SECRET_ACCESS_KEY": keys[1],
            "AWS_SESSION_TOKEN": keys[2],
        }
        return {name: value for name, value in names.items() if value}

    def spark_conf(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """Hadoop S3A settings for a Spark process that reaches the same S3 as the engine: the endpoint (the
        settings', else boto3's variables), path-style access and plain HTTP for an endpoint of its own, the
        region, and a SHA-256 checksum on every object it writes. Never credentials: S3A's default provider
        chain reads the AWS_* variables that `child_env` gives the process, so keys stay out of Spark's conf,
        its UI and its logs."""
        endpoint = self.endpoint_url or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        region = self.region_name or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        # a SHA-256 on every object S3A writes: a snapshot then copies a checkpoint's files within S3 by that
        # checksum, without a staging copy to learn it (snapshots/create.py `_copy_in_s3`)
        conf = {f"{S3A}.create.checksum.algorithm": "SHA256"}
        if endpoint:
            conf[f"{S3A}.endpoint"] = endpoint
            conf[f"{S3A}.path.style.access"] = "true"  # bucket names as host names need DNS an own endpoint lacks
            if endpoint.startswith("http://"):
                conf[f"{S3A}.connection.ssl.enabled"] = "false"
        if region:
            conf[f"{S3A}.endpoint.region"] = region
        return conf


_clients: dict[tuple[S3Settings, int, tuple[str | None, ...]], _S3] = {}
_clients_lock = threading.Lock()
RETRY_MODES = ("standard", "adaptive", "legacy")
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
    "AWS_RETRY_MODE",
    "AWS_RESPONSE_CHECKSUM_VALIDATION",
)


def _retries(settings: S3Settings) -> dict[str, Any]:
    """botocore's retry settings: AWS_MAX_ATTEMPTS and AWS_RETRY_MODE, boto3's own variables, win. Both
    count attempts in all, the first included (Config's `max_attempts` would count retries only)."""
    attempts = os.environ.get("AWS_MAX_ATTEMPTS") or str(settings.max_attempts)
    mode = os.environ.get("AWS_RETRY_MODE") or "standard"
    if not attempts.isdigit() or int(attempts) < 1:
        raise InvalidInput(f"AWS_MAX_ATTEMPTS={attempts!r} is not a positive whole number: set it to e.g. 10")
    if mode not in RETRY_MODES:
        raise InvalidInput(f"AWS_RETRY_MODE={mode!r} is not one of {', '.join(RETRY_MODES)}: set it to standard")
    return {"total_max_attempts": int(attempts), "mode": mode}


@dataclass(frozen=True)
class _S3:
    client: Any
    transfer: Any  # s3transfer's TransferManager on that client, shared by every transfer of the process


def _s3(settings: S3Settings) -> _S3:
    """One client and transfer manager per settings, environment and process: both are thread-safe and
    expensive to build (a manager per call costs threads per transfer), but a forked child must not share
    its parent's connections or threads."""
    key = (settings, os.getpid(), tuple(os.environ.get(name) for name in _CHAIN_ENV))
    with _clients_lock:
        if key not in _clients:
            import boto3
            from boto3.s3.transfer import TransferConfig, create_transfer_manager
            from botocore.config import Config

            session = settings.session or boto3.session.Session(
                aws_access_key_id=settings.access_key_id,
                aws_secret_access_key=settings.secret_access_key,
                aws_session_token=settings.session_token,
                region_name=settings.region_name,
                botocore_session=_botocore_session(),
            )
            config = Config(
                retries=_retries(settings),
                # no HEAD before each download (module doc); AWS_RESPONSE_CHECKSUM_VALIDATION still wins
                response_checksum_validation=os.environ.get("AWS_RESPONSE_CHECKSUM_VALIDATION") or "when_required",
                max_pool_connections=settings.max_pool_connections,
                connect_timeout=settings.connect_timeout,
                read_timeout=settings.read_timeout,
            )
            client = session.client("s3", endpoint_url=settings.endpoint_url, config=config)
            transfer = create_transfer_manager(
                client,
                TransferConfig(
                    multipart_threshold=settings.multipart_threshold,
                    multipart_chunksize=settings.multipart_chunksize,
                    max_concurrency=settings.max_pool_connections,  # all transfers share it: one per connection
                    preferred_transfer_client="classic",
                ),
            )
            _clients[key] = _S3(client, transfer)
        return _clients[key]


def _timestamp(value: str) -> datetime:
    """A timestamp of an S3 answer: ISO 8601 (a listing's LastModified, a thousand a page) by Python's own parser,
    anything else (a HEAD's HTTP date) by botocore's. botocore's own goes through dateutil: 0.4 ms a timestamp
    here, a third of a snapshot's planning of a 500 MB checkpoint (817 objects listed)."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        from botocore.utils import parse_timestamp

        return parse_timestamp(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _botocore_session() -> Any:
    """A botocore session whose clients parse S3's timestamps with `_timestamp` (botocore's documented parser
    setting); a session the caller made (`S3Settings.session`) is left as it is."""
    import botocore.session

    session = botocore.session.get_session()
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_timestamp)
    return session


@contextmanager
def s3_errors(action: str, uri: str, bucket: str, endpoint: str = "") -> Iterator[None]:
    """Translate botocore and s3transfer failures (after their retries) into errors that name the thing and
    the fix, without secrets: the endpoint is named by scheme and host only, never a whole request URL."""
    from botocore.exceptions import (
        ChecksumError,
        ClientError,
        ConnectTimeoutError,
        CredentialRetrievalError,
        EndpointConnectionError,
        FlexibleChecksumError,
        HTTPClientError,
        IncompleteReadError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.parsers import ResponseParserError
    from s3transfer.exceptions import RetriesExceededError, S3DownloadFailedError
    from urllib3.exceptions import ProtocolError

    # A connection reset, closed or timed out, a body cut short or garbled, a download that kept breaking (an
    # error answer's body broken while botocore reads it, a 404's say, reaches us as urllib3's own error):
    transport = (
        ProtocolError,
        BotoConnectionError,
        HTTPClientError,
        IncompleteReadError,
        ChecksumError,
        FlexibleChecksumError,
        ResponseParserError,
        RetriesExceededError,
        S3DownloadFailedError,
    )
    where = urlsplit(endpoint)
    server = f"the S3 endpoint {where.scheme}://{where.netloc}" if where.netloc else "S3"
    try:
        yield
    except (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError, ProfileNotFound):
        raise StoreUnavailable(
            f"no AWS credentials to {action} {uri} (or they cannot be loaded): set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or a valid AWS_PROFILE), or give the Airflow AWS connection a login and password"
        ) from None
    except (EndpointConnectionError, ConnectTimeoutError):
        raise StoreUnavailable(
            f"cannot reach {server} to {action} {uri}: check AWS_ENDPOINT_URL (or the connection's "
            "endpoint_url) and that the service is up"
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
        if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
            raise Conflict(f"{uri} was created, changed or deleted by someone else meanwhile ({code})") from None
        raise StoreUnavailable(
            f"{server} failed to {action} {uri}: {code} {error.get('Message', '')} (after botocore's retries): run "
            "the command again later; AWS_MAX_ATTEMPTS allows more attempts, AWS_RETRY_MODE=adaptive slows down on "
            "throttling"
        ) from None
    except transport as exc:
        cause = getattr(exc, "last_exception", None) or exc  # s3transfer's RetriesExceededError wraps the last
        raise StoreUnavailable(
            f"the connection to {server} kept failing while trying to {action} {uri} ({type(cause).__name__}, "
            "after botocore's and s3transfer's retries): check the network and the service, then run the command "
            "again; AWS_MAX_ATTEMPTS allows more attempts"
        ) from None


class S3Storage(Storage):
    def __init__(self, bucket: str, prefix: str = "", settings: S3Settings | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = settings or S3Settings()
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    @property
    def client(self) -> Any:
        return _s3(self.settings).client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _errors(self, action: str, key: str = "") -> AbstractContextManager[None]:
        return s3_errors(action, f"{self.uri}/{key}" if key else self.uri, self.bucket, self.client.meta.endpoint_url)

    def _get(self, key: str, target: str | IO[bytes], action: str = "read") -> str | None:
        """Download `key` into a file name or a binary file object through s3transfer (multipart above the
        threshold, retries of a body that breaks mid-read); returns its ETag (None when empty)."""
        with self._errors(action, key):
            future = _s3(self.settings).transfer.download(self.bucket, self._key(key), target)
            future.result()
            return future.meta.etag

    def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        after = {"StartAfter": root + start_after} if start_after else {}
        with self._errors("list", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix, **after):
                for obj in page.get("Contents", ()):
                    if obj["Key"].endswith("/"):
                        continue  # a directory marker (S3A writes them for mkdirs): not a file
                    info = obj["Key"][len(root) :], obj["Size"], obj["LastModified"].timestamp(), obj.get("ETag")
                    yield ObjectInfo(*info)

    def children(self, prefix: str) -> list[str]:
        under = (f"{self.prefix}/" if self.prefix else "") + prefix
        paginator = self.client.get_paginator("list_objects_v2")
        names = []
        with self._errors("list", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=under, Delimiter="/"):
                names += [common["Prefix"][len(under) :].rstrip("/") for common in page.get("CommonPrefixes", ())]
        return sorted(name for name in names if name)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            with self._errors("read", key):
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except FileNotFoundError:
            return None
        return ObjectInfo(key, head["ContentLength"], head["LastModified"].timestamp(), head.get("ETag"))

    def read_if_changed(self, key: str, version: str) -> tuple[bytes, str] | None:
        """One conditional GET (If-None-Match): a 304 answers without a body. A body that breaks while it is
        read (botocore does not retry that) is read again through `read_with_token`, s3transfer's retries."""
        from botocore.exceptions import ClientError

        with self._errors("read", key):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self._key(key), IfNoneMatch=version)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("304", "NotModified"):
                    return None
                raise
        try:
            with self._errors("read", key):
                return response["Body"].read(), str(response["ETag"])
        except StoreUnavailable:
            return self.read_with_token(key)

    def read(self, key: str) -> bytes:
        return self.read_with_token(key)[0]

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
        self._put(key, data)

    def _put(self, key: str, data: bytes, **condition: str) -> str:
        with self._errors("write", key):
            return str(self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)["ETag"])

    def create(self, key: str, data: bytes) -> str:
        return self._put_if(key, data, "someone else created it first", IfNoneMatch="*")

    def replace(self, key: str, data: bytes, token: str) -> str:
        return self._put_if(key, data, "someone else changed or deleted it since it was read", IfMatch=token)

    def token_of(self, data: bytes) -> str | None:
        # A single PUT's ETag is the MD5 of its body (not under SSE-KMS or SSE-C: there a write naming this
        # token meets a 412, which the caller takes as "not that content", and reads instead).
        return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'

    def _put_if(self, key: str, data: bytes, lost: str, **condition: str) -> str:
        try:
            return self._put(key, data, **condition)
        except (Conflict, FileNotFoundError):  # 412, or 404 for If-Match on a missing key
            pass
        # A retried PUT whose first attempt succeeded (its response lost on the way) answers 412 as well:
        # then the object holds exactly our bytes, and the write is ours (base.py: content is unique).
        try:
            current, token = self.read_with_token(key)
        except FileNotFoundError:
            current, token = None, ""
        if current == data:
            return token
        raise Conflict(f"{self.uri}/{key}: {lost}; nothing was written")

    def read_with_token(self, key: str) -> tuple[bytes, str]:
        buffer = io.BytesIO()
        etag = self._get(key, buffer)
        if etag is None:  # an empty object: its ranged GET answered InvalidRange, without an ETag
            with self._errors("read", key):
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            if head["ContentLength"]:
                raise Conflict(f"{self.uri}/{key} was written by someone else while it was read")
            etag = head["ETag"]
        return buffer.getvalue(), str(etag)

    def delete_if(self, key: str, token: str) -> bool:
        try:
            with self._errors("delete", key):
                self.client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=token)
        except FileNotFoundError:
            return False
        return True

    def upload(self, path: Path, key: str) -> None:
        with self._errors("upload to", key):
            _s3(self.settings).transfer.upload(str(path), self.bucket, self._key(key)).result()

    # -- server-side copies: S3 moves the bytes, this client sends requests only

    def same_service(self, other: Storage) -> bool:
        """Whether `other` is on the same S3 service with the same access, so that a CopyObject between them
        works (a checkpoint and a store opened by one job context are). Equal settings are one client in this
        process and environment (`_s3`), so one endpoint: asked for each file of a snapshot, this resolves no
        client (resolving two a file was a third of a 5 GB checkpoint's planning, 1.5 s for 1,682 files)."""
        return isinstance(other, S3Storage) and other.settings == self.settings

    def copies_within(self, other: Storage, size: int) -> bool:
        """Whether one CopyObject between `other` and this storage can move `size` bytes (same service, at
        most MAX_COPY): the one test both snapshot and restore apply before copying within S3."""
        return size <= MAX_COPY and self.same_service(other)

    def sha256(self, key: str) -> tuple[str | None, int]:
        """The SHA-256 (hex) S3 keeps of a whole object, if it was written with one (a single-part upload with
        the SHA256 checksum: S3A with `fs.s3a.create.checksum.algorithm=SHA256`, this engine's copies), and
        its size; one HEAD request, no bytes."""
        head = self.checksummed(key)
        return head.sha256, head.size

    def checksummed(self, key: str) -> Checksummed:
        """What one HEAD says of an object: the SHA-256 S3 keeps of it (`sha256`), its size and its ETag."""
        with self._errors("read", key):
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")
        value = head.get("ChecksumSHA256")
        whole = head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT" and value and "-" not in value
        return Checksummed(base64.b64decode(value).hex() if whole else None, int(head["ContentLength"]), head["ETag"])

    def hash_by_reading(self, key: str, etag: str, piece: int = 8 * 1024 * 1024) -> tuple[str, int]:
        """The SHA-256 (hex) and size of exactly the version of `key` that `etag` names, read in ranged GETs of
        `piece` bytes, each one conditional on it (If-Match): a version replaced meanwhile raises Conflict.
        For a server that keeps no checksum of an object: the bytes come down once and never go back up (the
        caller copies the object within S3, naming the same ETag). Memory: one piece."""
        from botocore.exceptions import ClientError

        digest = hashlib.sha256()
        size = 0
        while True:
            with self._errors("read", key):
                try:
                    response = self.client.get_object(
                        Bucket=self.bucket, Key=self._key(key), Range=f"bytes={size}-{size + piece - 1}", IfMatch=etag
                    )
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") != "InvalidRange":
                        raise
                    return digest.hexdigest(), size  # past the end (an empty object's first range, too)
                data = response["Body"].read()
            digest.update(data)
            size += len(data)
            if len(data) < piece:
                return digest.hexdigest(), size

    def copy_concurrency(self, concurrency: int) -> int:
        """How many CopyObjects to run at once beside `concurrency` transfers through this client: COPY_CONCURRENCY
        times as many, within the connection pool (a request beyond it would open a connection and drop it)."""
        if concurrency <= 1:  # one at a time, as asked
            return concurrency
        return max(concurrency, min(concurrency * COPY_CONCURRENCY, self.settings.max_pool_connections - concurrency))

    def copy(self, source: S3Storage, source_key: str, key: str, *, if_match: str | None = None) -> str | None:
        """One CopyObject of `source`/`source_key` to `key` (up to MAX_COPY bytes), asking S3 for the SHA-256 of
        what it copied: returns it (hex) when the answer carries it, else None (the copy is made all the same).
        A missing source raises FileNotFoundError; with `if_match` (an ETag), a source that is no longer that
        version raises Conflict, and nothing is copied, on a server that honours the condition
        (`honours_copy_condition`)."""
        condition = {"CopySourceIfMatch": if_match} if if_match else {}
        with self._errors("copy to", key):
            result = self.client.copy_object(
                Bucket=self.bucket,
                Key=self._key(key),
                CopySource={"Bucket": source.bucket, "Key": source._key(source_key)},
                ChecksumAlgorithm="SHA256",
                **condition,
            )
        value = result.get("CopyObjectResult", {}).get("ChecksumSHA256")
        return base64.b64decode(value).hex() if value else None

    def copy_from(self, source: S3Storage, source_key: str, key: str, *, if_match: str | None = None) -> str | None:
        """`copy`, and the SHA-256 the copy holds: S3's answer, or, from a service that computes none, the one the
        copy carries (its source's, written with one), or None."""
        said = self.copy(source, source_key, key, if_match=if_match)
        # S3Proxy and SeaweedFS answer a copy without the checksum it asked for, but keep the checksum an object
        # was written with (checked on the PUT) and carry it along with the bytes a copy moves: the copy's own
        # HEAD says it, one request more, and only on such a server. Without it every large file of a
        # checkpoint would travel through this client (or a create would take the copy for a replaced file).
        return said if said is not None else self.sha256(key)[0]

    def honours_copy_condition(self, source: S3Storage, source_key: str, key: str, etag: str) -> bool:
        """Whether this S3 refuses a copy whose CopySourceIfMatch names another version than the source's, as S3,
        SeaweedFS and S3Proxy do (moto copies all the same): one CopyObject of `source_key` (whose ETag is `etag`)
        to `key`, naming an ETag no object has. Where it is not refused, `key` holds a copy of the source as it is
        now: the caller copies it again (or deletes it)."""
        other = '"' + ("1" if etag.strip('"') == "0" * 32 else "0") * 32 + '"'
        try:
            self.copy(source, source_key, key, if_match=other)
        except Conflict:
            return True
        return False

    def download(self, key: str, path: Path, size: int | None = None) -> None:
        # `size` is not needed: the first (ranged) GET tells s3transfer the size, no HEAD request is made
        path.parent.mkdir(parents=True, exist_ok=True)
        self._get(key, str(path), "download")

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
