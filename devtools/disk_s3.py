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
and `make s3proxy` resolve it). `python -m devtools.disk_s3 DIR` runs one in the foreground on DIR (`--server
seaweedfs`: SeaweedFS, whose binary `make seaweedfs` builds once; `weed_binary` says why it is built as it is).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import ClassVar

from devtools import java, jvm
from devtools.embedded_s3 import DUMMY_CREDENTIALS, S3Endpoint
from devtools.jvm_service import JvmService, end_process
from devtools.ports import free_ports

START_TIMEOUT_SECONDS = 120.0  # a cold JVM on a loaded 2-core machine: seconds, not minutes
STOP_TIMEOUT_SECONDS = 15.0
VACUUM_GARBAGE = 0.01  # a volume with more than this share deleted is compacted
VACUUM_TIMEOUT_SECONDS = 1800.0  # gigabytes to copy on a loaded disk
# Jetty's worker threads: S3A's uploads, s5cmd's workers and the engine's 64 connections at once; each one
# blocked on disk I/O holds a thread (S3Proxy's default is 200)
MAX_THREADS = 256


def version() -> str:
    """S3Proxy's version, from the jar Maven resolved (named <artifactId>-<version>-<classifier>.jar)."""
    [jar] = jvm.classpath("s3proxy")
    return jar.parent.name


class DiskS3Error(RuntimeError):
    """The disk-backed S3 server failed to start."""


class DiskS3(JvmService, S3Endpoint):
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
        data = (self.data_dir or directory / "data").resolve()  # S3Proxy runs in its own directory
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

    def reclaim(self) -> None:
        """Nothing to do: every object is a file, and deleting it frees its space (SeaweedS3's needs a vacuum)."""


# SeaweedFS: the other server (`make seaweedfs`, `bench.scale_bench --server seaweedfs`). It keeps the SHA-256
# S3A sends with each upload (in an aws-chunked trailer), which S3Proxy drops: on it a snapshot copies a checkpoint's
# files within the server as on S3. Its `weed` binary is built from the Go module (the version the Go module proxy
# serves) once into the user's cache: 10 minutes of both cores here, too long for CI, which runs on S3Proxy.
SEAWEEDFS_MODULE = "github.com/seaweedfs/seaweedfs"
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
GO_BUILD_TIMEOUT_SECONDS = 3600


def weed_binary(cache: Path | None = None) -> Path:
    """SeaweedFS's `weed`, built once per version into `$XDG_CACHE_HOME/spark-savepoints/` (else ~/.cache/...).
    Not `go install module/weed@version`: the module's go.mod has replace directives, which `go install` refuses;
    built inside the downloaded module instead, where they apply."""
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spark-savepoints"
    binary = cache / f"seaweedfs-{SEAWEEDFS_VERSION}" / "weed"
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        raise DiskS3Error("building SeaweedFS needs Go (`go` on the PATH): install it, e.g. `apt-get install golang`")
    env = {**os.environ, "GOFLAGS": "-mod=mod"}  # the module's go.sum as it comes; nothing written into it
    module = f"{SEAWEEDFS_MODULE}@{SEAWEEDFS_VERSION}"
    downloaded = _go([go, "mod", "download", "-json", module], env, Path.cwd(), f"downloading {module}")
    source = Path(json.loads(downloaded)["Dir"])
    binary.parent.mkdir(parents=True, exist_ok=True)
    building = binary.with_name(f".weed-{os.getpid()}")
    _go([go, "build", "-o", str(building), "./weed"], env, source, f"building {module}/weed")
    os.replace(building, binary)  # atomic: a concurrent start finds the whole binary or none
    return binary


def _go(command: list[str], env: dict[str, str], cwd: Path, what: str) -> str:
    try:
        done = subprocess.run(
            command, env=env, cwd=cwd, capture_output=True, text=True, timeout=GO_BUILD_TIMEOUT_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        raise DiskS3Error(f"{what} took over {GO_BUILD_TIMEOUT_SECONDS} s: run `make seaweedfs` again") from None
    if done.returncode != 0:
        raise DiskS3Error(
            f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}. Check that the Go module proxy "
            "serves it (GOPROXY), then run `make seaweedfs` again"
        )
    return done.stdout


class SeaweedS3(S3Endpoint):
    """SeaweedFS's master, volume server, filer and S3 gateway in one `weed server` process on 127.0.0.1, its data
    in `data_dir` (kept) or a temporary directory (removed on stop). The same methods as DiskS3."""

    what = "the SeaweedFS S3 server"

    def __init__(self, data_dir: Path | None = None, start_timeout: float = START_TIMEOUT_SECONDS) -> None:
        self.data_dir, self.start_timeout = data_dir, start_timeout
        self.port = self.master_port = 0
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> SeaweedS3:
        binary = weed_binary()
        self._dir = Path(tempfile.mkdtemp(prefix="seaweedfs-"))
        data = (self.data_dir or self._dir / "data").resolve()  # weed runs in its own directory
        data.mkdir(parents=True, exist_ok=True)
        ports = free_ports(8)
        self.port, self.master_port = ports[0], ports[2]
        flags = {
            "dir": data,
            "ip": "127.0.0.1",  # its default is a made-up public address: every service stays on loopback
            "ip.bind": "127.0.0.1",
            "s3": "true",
            "s3.port": ports[0],
            "s3.port.grpc": ports[1],
            "s3.port.iceberg": 0,
            "master.port": ports[2],
            "master.port.grpc": ports[3],
            "volume.port": ports[4],
            "volume.port.grpc": ports[5],
            "filer.port": ports[6],
            "filer.port.grpc": ports[7],
            "filer.localSocket": self._dir / "filer.sock",
        }
        log = (self._dir / "weed.log").open("wb")
        try:
            self._process = subprocess.Popen(
                [str(binary), "server", *(f"-{name}={value}" for name, value in flags.items())],
                cwd=self._dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_serving(self) -> None:
        """Until its S3 gateway answers a listing (the gateway binds before the filer behind it is ready)."""
        deadline = time.monotonic() + self.start_timeout
        assert self._process is not None
        while time.monotonic() < deadline:
            try:
                self.client().list_buckets()
                return
            except Exception:  # not listening yet, or the filer not ready: asked again once it had time
                pass
            try:
                code = self._process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
            raise DiskS3Error(f"{self.what} exited with code {code} while starting: {self._log_tail()}")
        raise DiskS3Error(f"{self.what} did not come up within {self.start_timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return "\n".join((self._started_dir / "weed.log").read_text(errors="replace").splitlines()[-20:])
        except FileNotFoundError:
            return "(no log)"

    @property
    def _started_dir(self) -> Path:
        if self._dir is None:
            raise DiskS3Error(f"{self.what} is not started: use `with SeaweedS3() as server:`")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self._started_dir / "weed.log"

    def wait(self) -> int | None:
        return self._process.wait() if self._process is not None else None

    def reclaim(self) -> None:
        """Give back the disk the deleted objects still hold, now: SeaweedFS keeps them in its volume files until a
        vacuum compacts them, which it starts on its own only now and then, past a share of garbage. At 5 GB of state
        a peer's copy deleted is 8 GB the next steps need (the disk filled once). Blocks until the vacuum is done."""
        url = f"http://127.0.0.1:{self.master_port}/vol/vacuum?garbageThreshold={VACUUM_GARBAGE}"
        with urllib.request.urlopen(url, timeout=VACUUM_TIMEOUT_SECONDS) as answer:
            answer.read()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            end_process(process, process.terminate, STOP_TIMEOUT_SECONDS, self.what, logging.getLogger(__name__))
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


SERVERS = ("s3proxy", "seaweedfs")


def disk_server(kind: str, data_dir: Path | None = None) -> DiskS3 | SeaweedS3:
    """A disk-backed server of `kind` (SERVERS), not started."""
    if kind == "seaweedfs":
        return SeaweedS3(data_dir)
    if kind == "s3proxy":
        return DiskS3(data_dir)
    raise ValueError(f"unknown S3 server {kind!r}: use one of {', '.join(SERVERS)}")


def server_version(kind: str) -> str:
    return f"SeaweedFS {SEAWEEDFS_VERSION}" if kind == "seaweedfs" else f"S3Proxy {version()}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.disk_s3", description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, nargs="?", help="where the objects live (kept)")
    parser.add_argument("--server", choices=SERVERS, default="s3proxy", help="which server (default s3proxy)")
    parser.add_argument("--build", action="store_true", help="build SeaweedFS's binary if needed, then exit")
    args = parser.parse_args(argv)
    if args.build:
        print(f"SeaweedFS {SEAWEEDFS_VERSION}: {weed_binary()}")
        return 0
    if args.data_dir is None:
        parser.error("give the directory the objects live in (DATA_DIR)")
    with disk_server(args.server, args.data_dir) as server:
        what = server_version(args.server)
        print(f"{what} at {server.endpoint} on {args.data_dir} (log: {server.log_path}); Ctrl-C stops it")
        print(" ".join(f"{name}={value}" for name, value in server.env().items()), flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the `with` stops the server
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
