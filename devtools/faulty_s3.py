"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3 endpoint (the embedded moto server), for tests.

with EmbeddedS3() as s3, FaultyS3(s3.endpoint, rate=0.2, seed=7) as proxy:
    env = proxy.env()           # AWS_ENDPOINT_URL pointing at the proxy, dummy credentials
    ...
    proxy.counts()              # requests seen, how many got each fault, body bytes each way

Each request gets a fault with probability `rate` (drawn from a random.Random(seed): the n-th request the
proxy receives gets the n-th draw, so a client that sends its requests in a fixed order meets the same
faults in every run), or what `force()` queued for the next requests. The faults:

  internal_error      500 InternalError with S3's XML error body (the request body is read first)
  slow_down           503 SlowDown, likewise
  reset               the request is read, then the connection is reset (RST) without a response
  reset_mid_response  the request reaches the server; half of its response body is sent, then RST
  truncated           the request reaches the server; half of its response body is sent (its Content-Length
                      promises more), then the connection is closed (FIN)
                      (a response without a body is cut inside its status line instead)
  latency             the request waits `latency` seconds before it is passed on

and, asked for with `stall_write(n)`, the n-th write from then on (PUT, POST, DELETE; `to=`: of one key)
reaches the server and its answer is held back until `calm()`: a test kills the client meanwhile, right after
that write took effect.

Everything else passes through byte for byte in both directions: request and response heads unchanged,
bodies streamed as they arrive (Content-Length, chunked transfer encoding with its trailers, so also S3's
aws-chunked uploads, or until the server closes), `Expect: 100-continue` with the server's interim answer
relayed, keep-alive connections kept. Only loopback addresses are accepted, on both sides.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import socket
import socketserver
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import BinaryIO
from urllib.parse import urlsplit

from airflow_plugin.core.storage import S3Settings, S3Storage
from devtools.embedded_s3 import DUMMY_CREDENTIALS

FAULTS = ("internal_error", "slow_down", "reset", "reset_mid_response", "truncated", "latency")
SERVER_ERRORS = {
    "internal_error": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    "slow_down": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WRITES = ("PUT", "POST", "DELETE")
PIECE = 64 * 1024
MAX_LINE = 64 * 1024

Send = Callable[[bytes], None]


class FaultyS3:
    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.0,
        seed: int = 0,
        faults: Iterable[str] = FAULTS,
        latency: float = 0.2,
    ) -> None:
        target = urlsplit(upstream)
        if target.hostname not in LOOPBACK or target.port is None:
            raise ValueError(f"the faulty proxy only fronts a loopback endpoint with a port, not {upstream!r}")
        self.upstream = (target.hostname, target.port)
        self.latency = latency
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._forced: deque[str | None] = deque()
        self._rules: list[_Rule] = []
        self._stall: _Stall | None = None
        self.set_rate(rate, seed, faults)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- control

    def set_rate(self, rate: float, seed: int | None = None, faults: Iterable[str] | None = None) -> None:
        """From now on each request gets a fault with probability `rate`, chosen evenly from `faults`; a
        `seed` restarts the random sequence."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate {rate} is not between 0 and 1")
        chosen = _check_faults(faults) if faults is not None else None
        with self._lock:
            self.rate = rate
            if seed is not None:
                self._rng = random.Random(seed)
            if chosen is not None:
                self.faults = chosen

    def force(self, *faults: str | None) -> None:
        """The next requests get these faults, in this order, before any random draw (None: no fault)."""
        _check_faults([fault for fault in faults if fault is not None] or FAULTS)
        with self._lock:
            self._forced.extend(faults)

    def force_matching(self, method: str, target_contains: str, fault: str, *, after: int = 0) -> None:
        """Requests with this method whose target (path and query) contains `target_contains` get `fault`,
        once `after` of them have passed untouched: a fault at a point of an operation, however many other
        requests it makes around it."""
        _check_faults([fault])
        with self._lock:
            self._rules.append(_Rule(method.upper(), target_contains, fault, after))

    def stall_write(self, number: int, to: str = "") -> threading.Event:
        """The `number`-th write (PUT, POST or DELETE; from 1) from now on, of those whose path contains `to`,
        reaches the server and its answer is held back until `calm()`; the returned event is set once the
        server has answered it."""
        if number < 1:
            raise ValueError(f"writes are counted from 1, not {number}")
        with self._lock:
            self._release_stall()
            self._stall = _Stall(number, to)
            return self._stall.reached

    def _release_stall(self) -> None:
        """Call with the lock held."""
        if self._stall is not None:
            self._stall.release.set()
            self._stall = None

    def storage(self, bucket: str, prefix: str = "p", **settings: int) -> S3Storage:
        """The engine's storage of `bucket`/`prefix` with every request through this proxy (dummy
        credentials); `settings` are S3Settings' (e.g. max_attempts)."""
        return S3Storage(
            bucket,
            prefix,
            S3Settings(
                endpoint_url=self.endpoint,
                region_name=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"],
                access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                **settings,  # type: ignore[arg-type]
            ),
        )

    def calm(self) -> None:
        """No faults any more: rate 0, every fault kind eligible again, nothing queued, a held answer let go
        (its connection closed), counters reset."""
        with self._lock:
            self._release_stall()
            self.rate = 0.0
            self.faults = FAULTS
            self._forced.clear()
            self._rules.clear()
            self._counts.clear()

    def counts(self, reset: bool = False) -> dict[str, int]:
        """Requests seen ('requests'), passed on untouched ('passed'), per fault how many got it, and the
        body bytes that went to the server ('bytes_up') and came back ('bytes_down') through the proxy: what
        a client moved itself; `reset` starts counting again from zero."""
        with self._lock:
            zero = {"requests": 0, "passed": 0, **dict.fromkeys(FAULTS, 0), "bytes_up": 0, "bytes_down": 0}
            counts = {**zero, **self._counts}
            if reset:
                self._counts.clear()
            return counts

    def reset_counts(self) -> dict[str, int]:
        return self.counts(reset=True)

    def _counted(self, send: Send, name: str) -> Send:
        def counted(piece: bytes) -> None:
            with self._lock:
                self._counts[name] += len(piece)
            send(piece)

        return counted

    def _decide(self, method: str, target: str) -> str | _Stall | None:
        with self._lock:
            self._counts["requests"] += 1
            stall = self._stall
            if stall is not None and method in WRITES and stall.to in target and not stall.reached.is_set():
                stall.number -= 1
                if stall.number == 0:
                    self._counts["stalled"] += 1
                    return stall
            rule = next((r for r in self._rules if r.method == method and r.contains in target), None)
            if rule is not None and rule.after > 0:
                rule.after -= 1
                fault: str | None = None
            elif rule is not None:
                fault = rule.fault
            elif self._forced:
                fault = self._forced.popleft()
            else:
                draw, choice = self._rng.random(), self._rng.choice(self.faults)
                fault = choice if draw < self.rate else None
            self._counts[fault or "passed"] += 1
            return fault

    # -- life cycle

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def start(self) -> FaultyS3:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-s3", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._release_stall()
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        if self._thread is not None:
            self._thread.join()
        self._server = None

    def __enter__(self) -> FaultyS3:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | None) -> None:
        self.stop()


@dataclass
class _Stall:
    number: int  # writes still to pass before the one held
    to: str  # only writes whose path contains this count
    reached: threading.Event = field(default_factory=threading.Event)  # the held write's answer arrived
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Rule:
    method: str
    contains: str
    fault: str
    after: int  # matching requests still passed untouched


def _check_faults(faults: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(faults)
    unknown = set(chosen) - set(FAULTS)
    if unknown or not chosen:
        raise ValueError(f"unknown faults {sorted(unknown)}: choose from {', '.join(FAULTS)}")
    return chosen


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    # Python's default listen backlog is 5: a parallel client (s5cmd opens up to 256 connections) overflowed it and
    # waited on the kernel's retries, which the bench then counted as its copy time
    request_queue_size = 256
    proxy: FaultyS3

    def __init__(self, address: tuple[str, int], handler: type[socketserver.BaseRequestHandler]) -> None:
        self.sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, handler)

    def track(self, sock: socket.socket, add: bool = True) -> None:
        with self.sockets_lock:
            (self.sockets.add if add else self.sockets.discard)(sock)

    def close_connections(self) -> None:
        """Unblock handler threads waiting on idle keep-alive connections."""
        with self.sockets_lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Closed(Exception):
    """A peer closed its connection in the middle of a message."""


class _Handler(socketserver.BaseRequestHandler):
    server: _Server
    request: socket.socket

    def handle(self) -> None:
        self.client = self.request
        self.client_in = self.client.makefile("rb")
        self.upstream: socket.socket | None = None
        self.upstream_in: BinaryIO | None = None
        self.server.track(self.client)
        try:
            while (head := _read_head(self.client_in)) is not None and self._exchange(head):
                pass
        except (_Closed, OSError):
            pass
        finally:
            self.server.track(self.client, add=False)
            self._close_upstream()
            with contextlib.suppress(OSError):
                self.client_in.close()

    # -- one request and its response; False ends the connection

    def _exchange(self, head: bytes) -> bool:
        method, target, headers = _parse_head(head)
        request_framing = _request_framing(headers)
        expects_continue = headers.get("expect", "").lower() == "100-continue"
        fault = self.server.proxy._decide(method, target)

        if fault in ("internal_error", "slow_down", "reset"):
            if expects_continue:
                self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            _copy_body(self.client_in, None, request_framing)
            if fault == "reset":
                self._reset_client()
                return False
            self.client.sendall(_error_response(fault, method))
            return "close" not in headers.get("connection", "").lower()
        if fault == "latency":
            time.sleep(self.server.proxy.latency)

        upstream, upstream_in = self._upstream_connection()
        upstream.sendall(head)
        if expects_continue:
            interim = _read_head(upstream_in)
            if interim is None:
                raise _Closed
            self.client.sendall(interim)
            if _status(interim) != 100:  # a final answer before the body: the client sends no body now
                _copy_body(upstream_in, self.client.sendall, _response_framing(method, interim))
                return False
        _copy_body(self.client_in, self.server.proxy._counted(upstream.sendall, "bytes_up"), request_framing)

        response = self._final_response_head(upstream_in)
        framing = _response_framing(method, response)
        if isinstance(fault, _Stall):  # the write took effect; its answer never comes
            _copy_body(upstream_in, None, framing)
            fault.reached.set()
            fault.release.wait()
            self._close_upstream()
            return False
        if fault in ("truncated", "reset_mid_response"):
            body = bytearray()
            _copy_body(upstream_in, body.extend, framing)
            whole = response + bytes(body)
            # half the body; a response without one loses its status line half-way (a head cut at a line
            # boundary would pass for a complete one: http.client takes the end of the stream as its end)
            cut = len(response) + len(body) // 2 if len(body) >= 2 else response.index(b" ") + 1
            self.client.sendall(whole[:cut])
            self._close_upstream()
            if fault == "reset_mid_response":
                self._reset_client()
            else:
                self.client.shutdown(socket.SHUT_WR)
            return False
        self.client.sendall(response)
        _copy_body(upstream_in, self.server.proxy._counted(self.client.sendall, "bytes_down"), framing)
        response_headers = _parse_head(response)[2]
        closing = framing[0] == "close" or any(
            "close" in h.get("connection", "").lower() for h in (headers, response_headers)
        )
        if closing:
            self._close_upstream()
        return not closing

    def _final_response_head(self, upstream_in: BinaryIO) -> bytes:
        """The response head after relaying any interim (1xx) answers to the client."""
        while True:
            response = _read_head(upstream_in)
            if response is None:
                raise _Closed
            if not 100 <= _status(response) < 200:
                return response
            self.client.sendall(response)

    def _upstream_connection(self) -> tuple[socket.socket, BinaryIO]:
        if self.upstream is None or self.upstream_in is None:
            self.upstream = socket.create_connection(self.server.proxy.upstream)
            self.upstream_in = self.upstream.makefile("rb")
            self.server.track(self.upstream)
        return self.upstream, self.upstream_in

    def _close_upstream(self) -> None:
        if self.upstream is not None:
            self.server.track(self.upstream, add=False)
            with contextlib.suppress(OSError):
                self.upstream.close()
            if self.upstream_in is not None:
                with contextlib.suppress(OSError):
                    self.upstream_in.close()
        self.upstream = self.upstream_in = None

    def _reset_client(self) -> None:
        """Close with RST instead of FIN: the client sees 'connection reset by peer'."""
        self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.client.close()


# ---------------------------------------------------------------- HTTP/1.1 framing


def _read_head(stream: BinaryIO) -> bytes | None:
    """A request or response head, up to and including the empty line; None at a clean end of stream."""
    lines: list[bytes] = []
    while True:
        line = stream.readline(MAX_LINE)
        if not line:
            if lines:
                raise _Closed
            return None
        if not lines and line in (b"\r\n", b"\n"):
            continue  # stray CRLF between messages
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method or version, target or status, headers by lower-case name) of a head."""
    first, *rest = head.decode("latin-1").split("\r\n")
    parts = first.split(" ", 2)
    headers = {}
    for line in rest:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1] if len(parts) > 1 else "", headers


def _status(head: bytes) -> int:
    return int(_parse_head(head)[1])


Framing = tuple[str, int]  # ("length", n), ("chunked", 0) or ("close", 0)


def _request_framing(headers: dict[str, str]) -> Framing:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return ("chunked", 0)
    return ("length", int(headers.get("content-length", "0") or 0))


def _response_framing(method: str, head: bytes) -> Framing:
    status = _status(head)
    headers = _parse_head(head)[2]
    if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
        return ("length", 0)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return ("chunked", 0)
    if "content-length" in headers:
        return ("length", int(headers["content-length"]))
    return ("close", 0)


def _copy_body(source: BinaryIO, send: Send | None, framing: Framing) -> None:
    """Relay one message body exactly as framed (or drop it when `send` is None)."""
    emit = send or (lambda _: None)
    kind, length = framing
    if kind == "length":
        _copy_exactly(source, emit, length)
    elif kind == "close":
        while piece := source.read1(PIECE):
            emit(piece)
    else:
        while True:
            line = source.readline(MAX_LINE)
            if not line:
                raise _Closed
            emit(line)
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                break
            _copy_exactly(source, emit, size + 2)  # the chunk and its CRLF
        while True:  # trailers (aws-chunked checksums travel here), then the final empty line
            line = source.readline(MAX_LINE)
            if not line:
                raise _Closed
            emit(line)
            if line in (b"\r\n", b"\n"):
                break


def _copy_exactly(source: BinaryIO, emit: Send, length: int) -> None:
    while length > 0:
        piece = source.read1(min(length, PIECE))
        if not piece:
            raise _Closed
        emit(piece)
        length -= len(piece)


def _error_response(fault: str, method: str) -> bytes:
    status, reason, code, message = SERVER_ERRORS[fault]
    request_id = secrets.token_hex(8).upper()
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{request_id}</RequestId><HostId>faulty-s3</HostId></Error>"
    ).encode()
    if method == "HEAD":  # a HEAD response never has a body
        body = b""
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        "\r\n"
    )
    return head.encode("latin-1") + body
