"""moto's S3 server (devtools.embedded_s3) in its own process, counting the requests it serves.

    python -m bench.s3_server

Prints the endpoint on its first line. Then, for every line `counts` on stdin, prints one JSON line with
the requests served so far per S3 operation (seen by the server: the same view for the engine, awscli and
s5cmd) under "requests", and the body bytes received ("bytes_up") and sent ("bytes_down"); stops when stdin
closes. Its own process, so that the engine under test does not share a GIL
with the server.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from devtools.embedded_s3 import EmbeddedS3

_BUCKET_QUERIES = ("location", "versioning", "acl", "policy", "cors", "tagging", "lifecycle", "encryption")


def operation(method: str, path: str, query: str, environ: dict[str, Any]) -> str:
    """The S3 operation of a path-style request (what an IP endpoint always gets)."""
    parts = path.lstrip("/").split("/", 1)
    on_object = len(parts) == 2 and parts[1] != ""
    params = {item.split("=", 1)[0] for item in query.split("&") if item}
    if not parts[0]:
        return "ListBuckets"
    if not on_object:
        special = next((q for q in _BUCKET_QUERIES if q in params), None)
        if special:
            return f"{method} bucket?{special}"
        if method == "POST" and "delete" in params:
            return "DeleteObjects"
        return {"GET": "ListObjects", "PUT": "CreateBucket", "HEAD": "HeadBucket"}.get(method, f"{method} bucket")
    if method == "PUT":
        if "partNumber" in params:
            return "UploadPart"
        return "CopyObject" if environ.get("HTTP_X_AMZ_COPY_SOURCE") else "PutObject"
    if method == "POST":
        return "CreateMultipartUpload" if "uploads" in params else "CompleteMultipartUpload"
    return {"GET": "GetObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}.get(method, f"{method} object")


class CountingApp:
    """WSGI middleware in front of moto's app."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.counts: Counter[str] = Counter()
        self.bytes = Counter({"bytes_up": 0, "bytes_down": 0})
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        name = operation(
            environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", ""), environ
        )
        with self.lock:
            self.counts[name] += 1
            self.bytes["bytes_up"] += int(environ.get("CONTENT_LENGTH") or 0)
        return self._counted(self.app(environ, start_response))

    def _counted(self, body: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for chunk in body:
                with self.lock:
                    self.bytes["bytes_down"] += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"requests": dict(self.counts), **self.bytes}


def install_counter(server: EmbeddedS3) -> CountingApp | None:
    """Wrap the running werkzeug server's app (EmbeddedS3 keeps the server at `_server`)."""
    wsgi_server = getattr(server, "_server", None)
    if wsgi_server is None or not hasattr(wsgi_server, "app"):
        return None
    counting = CountingApp(wsgi_server.app)
    wsgi_server.app = counting
    return counting


def main() -> None:
    server = EmbeddedS3().start()
    counting = install_counter(server)
    print(server.endpoint, flush=True)
    try:
        for line in sys.stdin:  # the parent closes our stdin to stop us
            if line.strip() == "counts":
                print(json.dumps(counting.snapshot() if counting else None), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
