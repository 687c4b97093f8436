"""A disk-backed, concurrent S3 server on 127.0.0.1: S3Proxy (Apache 2.0) with its filesystem store, in a JVM of
its own, for the benchmarks at scale (bench/scale_bench.py) and the tests that need an S3 that behaves like one.

with DiskS3() as s3:                # its objects in a temporary directory, removed on stop
    s3.create_bucket("lake")
    env = s3.env()                  # AWS_ENDPOINT_URL and dummy credentials for child processes
    conf = s3.s3a_conf()            # Spark conf for s3a:// paths on it (keys included)

Why not the embedded moto server (devtools/embedded_s3.py) everywhere: moto holds every object in memory, serves
about one request at a time (one Python process) and computes a copy's checksum on the client's cores, so neither
gigabytes of state nor a parallel peer (s5cmd) can be measured on it. S3Proxy writes objects to files, serves
requests on Jetty's thread pool and honours the conditional writes the engine's leases and catalogs are made of
(tests/e2e/test_disk_s3.py checks each feature against it). What it does differently from S3 is in
docs/benchmarks.md ("The disk-backed S3 server"). moto stays where a test needs its start-up speed or the fault
proxy in front of it.

The jar comes from Maven Central through devtools/jvm.py (group `s3proxy`, ~55 MB once into ~/.m2; `make setup`
and `make s3proxy` resolve it). `python -m devtools.disk_s3 DIR` runs one in the foreground on DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from airflow_plugin.core.storage import S3Settings
from devtools import java, jvm
from devtools.embedded_s3 import DUMMY_CREDENTIALS
from devtools.jvm_service import JvmService
from devtools.ports import free_ports

START_TIMEOUT_SECONDS = 120.0  # a cold JVM on a loaded 2-core machine: seconds, not minutes
STOP_TIMEOUT_SECONDS = 15.0
# Jetty's worker threads: S3A's uploads, s5cmd's workers and the engine's 64 connections at once; each one
# blocked on disk I/O holds a thread (S3Proxy's default is 200)
MAX_THREADS = 256


def version() -> str:
    """S3Proxy's version, from the jar Maven resolved (named <artifactId>-<version>-<classifier>.jar)."""
    [jar] = jvm.classpath("s3proxy")
    return jar.parent.name


class DiskS3Error(RuntimeError):
    """The disk-backed S3 server failed to start."""


class DiskS3(JvmService):
    what = "the disk-backed S3 server (S3Proxy)"
    error = DiskS3Error
    dir_prefix = "disk-s3-"
    log_name = "s3proxy.log"
    stop_timeout = STOP_TIMEOUT_SECONDS
    # how its own JVM runs: a heap for Jetty's buffers (bodies stream to and from the files), C1 alone is not
    # set (a bench run is long enough for C2 to pay off)
    heap: ClassVar[str] = "-Xmx1g"

    def __init__(self, data_dir: Path | None = None, start_timeout: float = START_TIMEOUT_SECONDS) -> None:
        """`data_dir`: where the objects live (kept after stop; a bench's state of gigabytes wants a disk of its
        choosing); by default a directory inside the service's own temporary one, removed on stop."""
        super().__init__(start_timeout)
        self.data_dir = data_dir
        self.port = 0

    # --- lifecycle

    def _java_command(self) -> list[str]:
        problem = java.java_problem()
        executable = java.java_executable()
        if problem or executable is None:
            raise DiskS3Error(f"the disk-backed S3 server needs Java: {problem}")
        classpath = os.pathsep.join(str(jar) for jar in jvm.classpath("s3proxy"))
        return [executable, self.heap, "-cp", classpath, "org.gaul.s3proxy.Main"]

    def _launch(self, command: list[str]) -> bool:
        directory = self._started_dir
        data = self.data_dir or directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        [self.port] = free_ports(1)
        settings = {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "s3proxy.credential": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "s3proxy.jetty.max-threads": str(MAX_THREADS),
            # S3Proxy's own store on java.nio files (its metadata in extended attributes); jclouds' older
            # `filesystem` provider answers the same (both were probed)
            "jclouds.provider": "filesystem-nio2",
            "jclouds.filesystem.basedir": str(data),
        }
        config = directory / "s3proxy.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        self._spawn([*command, "--properties", str(config)], cwd=directory)
        return self._wait_until(self._answers, time.monotonic() + self.start_timeout)

    def _answers(self) -> bool:
        """Whether the server accepts a connection: S3Proxy binds its port once it serves."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def wait(self) -> int | None:
        """Until the server's JVM exits (its exit code); None when it was not started."""
        return self._process.wait() if self._process is not None else None

    # --- what clients need (the same as devtools/embedded_s3.py's EmbeddedS3 gives)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def s3a_conf(self) -> dict[str, str]:
        """Spark conf for s3a:// paths on this server, keys included (for a SparkSession of a test or a bench,
        which has no driver environment of its own); the jars come from devtools.jvm.spark_conf(["s3a"])."""
        settings = S3Settings(endpoint_url=self.endpoint, region_name=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"])
        return {
            **settings.spark_conf({}),  # what the engine gives a job's Spark (storage/s3.py)
            "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "spark.hadoop.fs.s3a.access.key": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "spark.hadoop.fs.s3a.secret.key": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        }

    def airflow_connection(self) -> str:
        """An Airflow AWS connection (JSON form, for AIRFLOW_CONN_<ID>) to this server."""
        return json.dumps(
            {
                "conn_type": "aws",
                "login": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                "password": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                "extra": {"endpoint_url": self.endpoint, "region_name": DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"]},
            }
        )

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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.disk_s3", description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="where the objects live (kept)")
    args = parser.parse_args(argv)
    with DiskS3(args.data_dir) as server:
        print(f"S3Proxy {version()} at {server.endpoint} on {args.data_dir} (log: {server.log_path}); Ctrl-C stops it")
        print(" ".join(f"{name}={value}" for name, value in server.env().items()), flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the `with` stops the server
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
