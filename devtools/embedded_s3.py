"""An embedded S3 API on 127.0.0.1 (moto's server mode), for the demo, end-to-end tests and benchmarks.

with EmbeddedS3() as s3:            # sets nothing globally
    s3.create_bucket("snapshots")
    env = s3.env()                  # AWS_ENDPOINT_URL and dummy credentials for child processes
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from airflow_plugin.core.storage import S3Settings

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _s3_first_app() -> Any:
    """moto's server app, made cheaper per request for what this server serves, S3 (the same answers):
    - moto finds a request's service by matching its host against the URL patterns of every service it
      emulates, on every request: a request signed for S3 goes to the S3 app directly;
    - moto turns every timestamp it serializes (each key's LastModified in a listing) from its ISO 8601 string
      back into a datetime with dateutil's general parser: Python's own ISO 8601 parser first.
    Together they halved the server's time per request (GET, HEAD and a listing), and S3A's many probes and
    listings made the server a quarter of the CPU of an end-to-end test."""
    from moto.core import serialize
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    general = serialize.parse_to_aware_datetime
    if not getattr(general, "iso_first", False):

        def iso_first(value: Any) -> Any:
            if isinstance(value, str):
                try:
                    parsed = datetime.fromisoformat(value)
                except ValueError:
                    return general(value)
                return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
            return general(value)

        iso_first.iso_first = True  # type: ignore[attr-defined]
        serialize.parse_to_aware_datetime = iso_first

    conditional = threading.Lock()

    class S3First(DomainDispatcherApplication):  # type: ignore[misc]
        def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
            # moto checks a write's condition (If-None-Match, If-Match) and then writes, in two steps another request
            # thread can come between: two racers both won one lease. S3 does both at once: here, one at a time
            if environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE") and any(key in environ for key in CONDITIONS):
                with conditional:
                    return super().__call__(environ, start_response)
            return super().__call__(environ, start_response)

        def get_application(self, environ: dict[str, Any]) -> Any:
            signed_for_s3 = "/s3/aws4_request" in environ.get("HTTP_AUTHORIZATION", "")
            path = environ.get("PATH_INFO", "")
            if not signed_for_s3 or path.startswith(("/moto-api", "/v20180820/")):  # moto's API, S3 Control
                return super().get_application(environ)
            with self.lock:
                if "s3" not in self.app_instances:
                    self.app_instances["s3"] = self.create_app("s3")
                return self.app_instances["s3"]

    return S3First(create_backend_app)


# the WSGI names of the headers that make a write conditional
CONDITIONS = ("HTTP_IF_MATCH", "HTTP_IF_NONE_MATCH", "HTTP_X_AMZ_COPY_SOURCE_IF_MATCH")


class S3Endpoint:
    """What a client needs of an S3 server on 127.0.0.1:`port` with the dummy credentials: this embedded one, and
    the disk-backed ones (devtools/disk_s3.py)."""

    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def airflow_connection(self) -> str:
        """An Airflow AWS connection (JSON form, for AIRFLOW_CONN_<ID>) to this server."""
        import json

        return json.dumps(
            {
                "conn_type": "aws",
                "login": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                "password": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                "extra": {"endpoint_url": self.endpoint, "region_name": DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"]},
            }
        )

    def s3a_conf(self) -> dict[str, str]:
        """Spark conf for s3a:// paths on this server, keys included (for a SparkSession of a test, which has
        no driver environment of its own); the jars come from devtools.jvm.spark_conf(["s3a"])."""
        settings = S3Settings(endpoint_url=self.endpoint, region_name=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"])
        return {
            **settings.spark_conf({}),  # what the engine gives a job's Spark (storage/s3.py)
            "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "spark.hadoop.fs.s3a.access.key": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "spark.hadoop.fs.s3a.secret.key": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"],
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"


class EmbeddedS3(S3Endpoint):
    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> EmbeddedS3:
        """moto's server app on werkzeug, as moto's ThreadedMotoServer runs it, with one change: werkzeug
        answers `Expect: 100-continue` itself, and http.server under it answered it a second time. The AWS
        SDK v2's async client (S3A's uploads: RocksDB state snapshots, rescale) took that second `100` for the
        final answer and failed with "S3Exception: Status Code: 100" (moto pull request 9975)."""
        from moto.moto_server.werkzeug_app import MotoRequestHandler
        from werkzeug.serving import make_server

        class OneContinue(MotoRequestHandler):  # type: ignore[misc]
            def handle_expect_100(self) -> bool:
                return True  # werkzeug sends the one `100 Continue` when the app reads the body

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        app = _s3_first_app()
        self._server = make_server("127.0.0.1", self.port, app, threaded=True, request_handler=OneContinue)
        self.port = self._server.server_port  # port=0 picks a free one
        self._thread = threading.Thread(target=self._server.serve_forever, name="embedded-s3", daemon=True)
        self._thread.start()
        return self

    def apply_env(self) -> None:
        """Point this process's boto3 at the embedded server."""
        os.environ.update(self.env())

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> EmbeddedS3:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | None) -> None:
        self.stop()
