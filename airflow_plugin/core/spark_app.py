"""Starts the Spark applications the engine needs (deep verify, pre-flight) as their own processes:
the engine never imports pyspark. The scripts live in spark_jobs/tools/. Also what every launch checks and
sets: spark-submit and Java are there, pyspark's files are one version, and local Spark stays on loopback; and
for a SparkSession started inside this Python, that `$SPARK_HOME`'s Spark is pyspark's version."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LaunchFailed, SparkToolFailed

SPARK_MASTER_ENV = "SAVEPOINTS_SPARK_MASTER"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SparkAccess:
    """What a Spark tool working on a job's locations needs: the job's Spark conf (its jars, S3A settings;
    no key) and the environment that carries the store's credentials (never printed)."""

    conf: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict, repr=False)


def tool_path(name: str) -> Path:
    spec = importlib.util.find_spec("spark_jobs")
    if spec is None or not spec.submodule_search_locations:
        raise SparkToolFailed(
            "the spark_jobs package is not installed: install spark-savepoints with its [spark] extra"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tools" / f"{name}.py"


def spark_submit_binary() -> str:
    """spark-submit from PATH, else next to this Python (pyspark's, in the same environment)."""
    found = shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")
    if not Path(found).exists():
        raise LaunchFailed("spark-submit not found: install pyspark (the [spark] extra) or put Spark's bin on PATH")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise LaunchFailed("Java is not installed: Spark needs Java 17 (set JAVA_HOME or put java on PATH)")
    return found


def pyspark_conflict(pyspark: str | None, client: str | None) -> str | None:
    """Why an environment's pyspark cannot be trusted, or None. pyspark-client (which the Airflow Spark
    provider requires) installs into pyspark's own files: with another version than pyspark's, the Python
    side of Spark no longer matches its jars."""
    if pyspark is None or client is None or pyspark == client:
        return None
    return (
        f"pyspark {pyspark} and pyspark-client {client} are both installed and share the files of the pyspark "
        f"package, so its Python code no longer matches Spark's jars: install the same version of both "
        f"(`pip install pyspark=={pyspark} pyspark-client=={pyspark}`)"
    )


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_pyspark_files() -> None:
    """Refuse to launch Spark from an environment whose pyspark files are of two versions."""
    problem = pyspark_conflict(_installed("pyspark"), _installed("pyspark-client"))
    if problem:
        raise LaunchFailed(problem)


_SPARK_CORE_JAR = re.compile(r"spark-core_[0-9.]+-(?P<version>.+)\.jar")


def jars_version(spark_home: Path) -> str | None:
    """The Spark version of a Spark home's jars (`jars/spark-core_<scala>-<version>.jar`), None if it has none."""
    for jar in sorted((spark_home / "jars").glob("spark-core_*.jar")):
        if match := _SPARK_CORE_JAR.fullmatch(jar.name):
            return match["version"]
    return None


def spark_home_conflict(pyspark: str | None, spark_home: str | None) -> str | None:
    """Why `SPARK_HOME` cannot serve this environment's pyspark, or None. A SparkSession started from Python
    runs the JVM of `$SPARK_HOME` under the installed pyspark's Python files: of another version, Python calls
    constructors the jars do not have (a transformWithState query fails with a Py4JError)."""
    if pyspark is None or not spark_home:
        return None
    jvm = jars_version(Path(spark_home))
    if jvm is None or jvm == pyspark:
        return None
    return (
        f"SPARK_HOME={spark_home} holds Spark {jvm}, but this environment's pyspark is {pyspark}: a Spark session "
        f"started here would run Spark {jvm}'s JVM under pyspark {pyspark}'s Python. Unset SPARK_HOME (pyspark "
        f"brings its own Spark), or point it at a Spark {pyspark}"
    )


def check_session_spark() -> None:
    """Refuse to start a SparkSession inside this Python (the tests', the benchmarks') whose Python and JVM
    sides would be of two Spark versions."""
    check_pyspark_files()
    problem = spark_home_conflict(_installed("pyspark"), os.environ.get("SPARK_HOME"))
    if problem:
        raise LaunchFailed(problem)


def loopback_env(master: str) -> dict[str, str]:
    """Local Spark binds and advertises 127.0.0.1 (its UI would listen on every interface, its block manager
    on the host's address) unless the environment says otherwise; clusters need their real addresses."""
    if not master.startswith("local") or os.environ.get("SPARK_LOCAL_IP"):
        return {}
    return {"SPARK_LOCAL_IP": LOOPBACK}


def run_spark_tool(
    name: str,
    args: list[str],
    *,
    conf: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 900,
) -> str:
    """Run spark_jobs/tools/<name>.py with spark-submit and return its stdout; fail with its stderr tail."""
    check_pyspark_files()
    master = os.environ.get(SPARK_MASTER_ENV, "local[2]")
    command = [spark_submit_binary(), "--master", master]
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.driver.host": LOOPBACK,
        **(conf or {}),
    }.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(tool_path(name)), *args]
    child = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        **loopback_env(master),
        **(env or {}),
    }
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=child, check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise SparkToolFailed(f"Spark tool {name} failed (exit {result.returncode}):\n{tail}")
    return result.stdout


FENCE_SOURCES = "runtime/jvm"  # in the spark_jobs package: the driver's fence (spark_jobs/runtime/fence.py)
FENCE_MANAGER = "savepoints.fence.FencedCheckpointFileManager"
CHECKPOINT_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
FENCE_DELEGATE_CONF = "spark.savepoints.fence.delegate"  # a manager the job's own conf named: ours wraps it


def _spark_jars() -> Path:
    """The jars of the Spark that spark-submit runs: `$SPARK_HOME`'s, else the installed pyspark's."""
    if home := os.environ.get("SPARK_HOME"):
        return Path(home) / "jars"
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise LaunchFailed("pyspark is not installed: install spark-savepoints with its [spark] extra")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "javac") if home and (Path(home) / "bin" / "javac").exists() else None
    found = found or shutil.which("javac")
    if found is None:
        raise LaunchFailed(
            "javac not found: the drivers' fence (a few Java classes of spark_jobs/runtime/jvm/) is compiled on first "
            "use against Spark's jars; install a JDK 17 (Debian/Ubuntu: `apt-get install -y openjdk-17-jdk-headless`) "
            "or set JAVA_HOME to one"
        )
    return found


def fence_jar(cache: Path | None = None) -> Path:
    """The drivers' fence as a jar, compiled once per source and Spark version into the user's cache
    (`$XDG_CACHE_HOME/spark-savepoints/`, else `~/.cache/...`) and reused: `make setup` builds it ahead."""
    sources_dir = tool_path("x").parent.parent / FENCE_SOURCES
    sources = sorted(sources_dir.rglob("*.java"))
    jars = _spark_jars()
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.relative_to(sources_dir).as_posix().encode() + b"\0" + source.read_bytes())
    digest.update(str(jars_version(jars.parent)).encode())
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spark-savepoints"
    jar = cache / f"savepoints-fence-{digest.hexdigest()[:16]}.jar"
    if jar.exists():
        return jar
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fence-") as work:
        classes = Path(work) / "classes"
        command = [_javac(), "--release", "17", "-nowarn", "-d", str(classes), "-cp", f"{jars}/*", *map(str, sources)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LaunchFailed(f"could not compile the drivers' fence ({' '.join(command[:2])} ...):\n{done.stderr}")
        built = Path(work) / jar.name
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for item in sorted(classes.rglob("*.class")):
                archive.write(item, item.relative_to(classes).as_posix())
        os.replace(built, jar)  # atomic: a concurrent launch finds the whole jar or none
    return jar


def fenced_conf(conf: dict[str, str]) -> dict[str, str]:
    """A deployment driver's Spark conf with its fence: the jar added to `spark.jars`, Spark's checkpoint file
    manager wrapped by the fenced one (which delegates to the manager the job's conf named, if any)."""
    jars = [jar for jar in conf.get("spark.jars", "").split(",") if jar]
    fenced = {**conf, "spark.jars": ",".join([*jars, str(fence_jar())]), CHECKPOINT_MANAGER_CONF: FENCE_MANAGER}
    if (own := conf.get(CHECKPOINT_MANAGER_CONF)) and own != FENCE_MANAGER:
        fenced[FENCE_DELEGATE_CONF] = own
    return fenced
