"""A class-data-sharing archive of a Spark driver's classes, for the JVMs the tests start through spark-submit.

    options, builder = start()     # "-XX:SharedArchiveFile=... ..." for SPARK_SUBMIT_OPTS; the archive's maker
    python -m devtools.class_archive   # builds it if missing

A driver spends its first seconds loading and verifying some 20,000 classes of Spark, Scala, Hadoop and Delta.
Java's application class-data sharing (JDK 13+, `-XX:ArchiveClassesAtExit`) writes the classes one run loaded
into an archive that later JVMs map instead. On 2 cores a trivial spark-submit took 7 to 8 s instead of 12, and
the pre-flight, file-lifecycle and inspect tests together 330 and 344 s instead of 514 and 455 (two rounds);
the suite starts a few hundred drivers.

The archive is made by running devtools/class_archive_app.py once (about two minutes; tests/conftest.py has it
made in the background when a test session starts without one, while the first tests run) and kept in
.jvm/class-archive/ (git-ignored). Its name is a digest of what it depends on: the java binary and version,
pyspark's jars (paths, sizes, times: a JVM checks all three), the Spark groups' jars and the app; a change of any
makes a new one and removes the old. A JVM given an archive that does not fit, or none yet, refuses it by itself
and starts as it would have. The product sets no JVM flag; this is for the tests' JVMs.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools import processes
from devtools.java import java_executable, java_version
from devtools.jvm import CACHE_DIR, spark_conf
from devtools.spark import spark_home

ARCHIVE_DIR = CACHE_DIR / "class-archive"
APP = Path(__file__).resolve().parent / "class_archive_app.py"
GROUPS = ("spark-kafka", "s3a", "delta")  # the jars the tests' drivers add to pyspark's own
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a JVM that cannot use the archive says nothing and runs without
BUILD_TIMEOUT_SECONDS = 600
BUILDER_ENV = "SAVEPOINTS_CLASS_ARCHIVE_BUILDER"


class ClassArchiveError(RuntimeError):
    """The archive could not be made (the app failed, or the JVM wrote nothing)."""


FAILURES = (ClassArchiveError, OSError, subprocess.TimeoutExpired)  # what leaves the JVMs without an archive


def archive_path() -> Path:
    """Where the archive for this machine's Java, Spark jars and app lives (whether or not it exists yet)."""
    java = java_executable()
    if java is None:
        raise ClassArchiveError("no java found: set JAVA_HOME or put java on PATH")
    digest = hashlib.sha256()
    # the version and the build, not the VM's line: it names flags (C1 only is "emulated-client")
    described = (java_version() or "").splitlines()[:2]
    digest.update(f"{os.path.realpath(java)}\n{described}".encode())
    for jar in sorted((spark_home() / "jars").glob("*.jar")):  # a JVM checks each jar's size and time too
        stat = jar.stat()
        digest.update(f"{jar} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    digest.update(repr(sorted(spark_conf(GROUPS).items())).encode())
    digest.update(APP.read_bytes())
    return ARCHIVE_DIR / f"spark-driver-{digest.hexdigest()[:16]}.jsa"


def build(target: Path) -> Path:
    """Run the app once with -XX:ArchiveClassesAtExit; the archive appears at `target` only when whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="class-archive-") as work:
        partial = target.with_suffix(f".{os.getpid()}.partial")
        command = [str(spark_home() / "bin" / "spark-submit"), "--master", "local[2]"]
        for key, value in {**spark_conf(GROUPS), "spark.ui.enabled": "false"}.items():
            command += ["--conf", f"{key}={value}"]
        command += [str(APP), work]
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial} {QUIET}",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False
        )
        if result.returncode != 0 or not partial.exists():
            partial.unlink(missing_ok=True)
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
            raise ClassArchiveError(f"the archive's app exited {result.returncode} ({APP.name}):\n{tail}")
        os.replace(partial, target)
    for stale in target.parent.glob("spark-driver-*.jsa"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


def ensure() -> Path:
    """The archive, built first if missing."""
    target = archive_path()
    if target.exists():
        return target
    print(f"class archive: making {target.name} once (about two minutes) ...", file=sys.stderr, flush=True)
    return build(target)


def start() -> tuple[str | None, subprocess.Popen[bytes] | None]:
    """The JVM options that make spark-submit's drivers map the archive, without waiting for it: when it is missing,
    a process of its own makes it (returned, to be waited for; its pid in $BUILDER_ENV for the processes started
    from here), and the JVMs that start before it is whole start without it, as with an archive that does not fit.
    (None, None) without java: the drivers start as they would have, only slower."""
    try:
        target = archive_path()
    except FAILURES as e:
        print(f"class archive: none, the drivers start without it: {e}", file=sys.stderr)
        return None, None
    builder = None
    if not target.exists():
        builder = subprocess.Popen(
            [sys.executable, "-m", "devtools.class_archive"], cwd=APP.parents[1], stdout=subprocess.DEVNULL
        )
        os.environ[BUILDER_ENV] = str(builder.pid)
    return f"-XX:SharedArchiveFile={target} {QUIET}", builder


def wait_for_builder() -> None:
    """Wait while the process named by $BUILDER_ENV makes the archive: for a JVM that must map it."""
    pid, target = os.environ.get(BUILDER_ENV), archive_path()
    while pid and not target.exists() and processes.running(int(pid)):
        time.sleep(0.5)


def main() -> int:
    try:
        target = ensure()
    except FAILURES as e:
        print(f"class archive: {e}", file=sys.stderr)
        return 1
    size = target.stat().st_size / 1e6
    print(f"class archive: {target}, {size:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
