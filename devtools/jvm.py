"""The project's JVM jars, resolved by Maven from the POMs in devtools/jvm/ (one per group).

    classpath("kafka-broker")                  # -> [Path, ...]: the jars of one group
    spark_conf(["spark-kafka", "s3a", "delta"])  # -> {"spark.jars": "...", ...} for a SparkSession or spark-submit
    python -m devtools.jvm [group ...]          # resolves (all groups by default); `make setup` runs it
    link("spark-kafka")                         # -> .jvm/lib/spark-kafka/: the jars as symlinks, for a jobs file

Groups: kafka-broker (a KRaft broker in its own JVM, devtools/kafka.py), hadoop-minicluster (HDFS and YARN in
one JVM, devtools/hadoop.py), s3proxy (a disk-backed S3 server in its own JVM, devtools/disk_s3.py), and for
Spark, on top of the jars pyspark ships: spark-kafka (the Kafka source and sink), s3a (hadoop-aws, s3a://
paths) and delta (Delta Lake).

Jars go into the user's Maven cache (~/.m2/repository, Maven's default), not a project-local repository:
every worktree and clone of the project, CI's fresh clone and the Maven builds on the machine share one
download of a few hundred MB. Only the list of jar paths is kept in the project, in .jvm/<group>.classpath
(git-ignored), keyed by the POM's SHA-256: a resolved group costs one small file read, and a changed POM or
a jar gone from ~/.m2 resolves again. Spark's own --packages (Ivy) resolver is never used.

Nothing pyspark ships (its jars/ directory) may be resolved again for a Spark group: two versions of one
library on a classpath fail at random. The POMs exclude those artifacts; `classpath` checks it every time
(pyspark may have changed since the list was cached) and names the artifact to exclude.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from airflow_plugin.core.sinks.delta import SESSION_CONF as DELTA_SESSION_CONF

ROOT = Path(__file__).resolve().parents[1]
POM_DIR = Path(__file__).resolve().parent / "jvm"
CACHE_DIR = ROOT / ".jvm"
LIB_DIR = CACHE_DIR / "lib"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MAVEN_TIMEOUT_SECONDS = 1800  # a cold download of every group is a few hundred MB
_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")  # Maven's launcher colours a line or two even in batch mode
_MAVEN_BOILERPLATE = ("To see the full", "Re-run Maven", "For more information", "[Help")


@dataclass(frozen=True)
class Group:
    description: str
    on_spark: bool  # its jars join pyspark's own in a Spark JVM (else: a JVM of its own)
    spark_conf: dict[str, str] = field(default_factory=dict)  # what a session needs besides the jars


GROUPS: dict[str, Group] = {
    "kafka-broker": Group("org.apache.kafka:kafka_2.13 (KRaft broker)", on_spark=False),
    "hadoop-minicluster": Group(
        "org.apache.hadoop:hadoop-client-minicluster (HDFS and YARN in one JVM)", on_spark=False
    ),
    "s3proxy": Group("org.gaul:s3proxy (a disk-backed S3 server, devtools/disk_s3.py)", on_spark=False),
    "spark-kafka": Group("org.apache.spark:spark-sql-kafka-0-10_2.13 (Kafka source and sink)", on_spark=True),
    "s3a": Group("org.apache.hadoop:hadoop-aws (s3a:// filesystem)", on_spark=True),
    "delta": Group(
        "io.delta:delta-spark_4.2_2.13 (Delta Lake)",
        on_spark=True,
        spark_conf=DELTA_SESSION_CONF,
    ),
}


class JvmError(RuntimeError):
    """A group's jars could not be resolved, or would clash with pyspark's."""


def classpath(group: str, *, pom_dir: Path = POM_DIR, cache_dir: Path = CACHE_DIR) -> list[Path]:
    """The jars of `group`, resolved with Maven on first use (or when its POM changed)."""
    pom, digest, cache = _locate(group, pom_dir, cache_dir)
    jars = _cached(cache, digest)
    if jars is None:
        jars = _resolve(group, pom)
        _store(cache, digest, jars)
    if group in GROUPS and GROUPS[group].on_spark:
        _refuse_duplicates(jars, str(pom))
    return jars


def is_resolved(group: str, *, pom_dir: Path = POM_DIR, cache_dir: Path = CACHE_DIR) -> bool:
    """Whether `classpath(group)` answers from its cache, without Maven."""
    _, digest, cache = _locate(group, pom_dir, cache_dir)
    return _cached(cache, digest) is not None


def spark_conf(groups: Iterable[str]) -> dict[str, str]:
    """Spark conf entries that add these groups to a session: spark.jars plus what each group needs."""
    groups = list(groups)
    conf: dict[str, str] = {}
    jars: list[Path] = []
    for group in groups:
        if group not in GROUPS or not GROUPS[group].on_spark:
            spark_groups = [name for name, g in GROUPS.items() if g.on_spark]
            raise JvmError(f"{group!r} is not a Spark group: use one of {', '.join(spark_groups)}")
        jars += [jar for jar in classpath(group) if jar not in jars]
        conf.update(GROUPS[group].spark_conf)
    _refuse_duplicates(jars, f"the POMs of {', '.join(groups)} in {POM_DIR}")  # one artifact, two versions
    return {"spark.jars": ",".join(str(jar) for jar in jars), **conf}


def link(group: str, lib_dir: Path = LIB_DIR) -> Path:
    """The jars of a Spark group as symlinks in one directory, `.jvm/lib/<group>/`: a jobs file (whose paths are
    relative to it) names them as `"spark.jars" = ".jvm/lib/spark-kafka/*.jar"` without knowing ~/.m2's layout."""
    jars = classpath(group)
    directory = lib_dir / group
    directory.mkdir(parents=True, exist_ok=True)
    names = {jar.name: jar for jar in jars}
    for stale in directory.iterdir():
        if stale.name not in names or stale.resolve() != names[stale.name]:
            stale.unlink()
    for name, jar in names.items():
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(jar)
    return directory


def artifact_id(jar: Path) -> str:
    """A jar's artifactId, from its place in a Maven repository: <group path>/<artifactId>/<version>/<file>."""
    return jar.parent.parent.name


def pyspark_jars() -> list[str]:
    """File names of the jars pyspark ships (empty without pyspark: then nothing can be there twice)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return []
    jars_dir = Path(next(iter(spec.submodule_search_locations))) / "jars"
    return sorted(p.name for p in jars_dir.glob("*.jar"))


def _locate(group: str, pom_dir: Path, cache_dir: Path) -> tuple[Path, str, Path]:
    pom = pom_dir / f"{group}.xml"
    if not pom.is_file():
        raise JvmError(f"unknown JVM group {group!r}: there is no {pom} (groups: {', '.join(GROUPS)})")
    return pom, hashlib.sha256(pom.read_bytes()).hexdigest(), cache_dir / f"{group}.classpath"


def _refuse_duplicates(jars: list[Path], where: str) -> None:
    shipped = pyspark_jars()
    problems = []
    seen: dict[str, Path] = {}
    for jar in jars:
        name = artifact_id(jar)
        # "<artifactId>-<digit>" tells hadoop-client-api-3.5.0.jar from hadoop-client-api-extras-1.jar
        twin = next((s for s in shipped if re.match(re.escape(name) + r"-\d", s)), None)
        if twin:
            problems.append(f"{name} ({jar.name}) is already in pyspark's jars ({twin})")
        elif name in seen and seen[name] != jar:
            problems.append(f"{name} comes twice: {seen[name].name} and {jar.name}")
        seen.setdefault(name, jar)
    if problems:
        raise JvmError(
            "the classpath would hold a library twice: "
            + "; ".join(problems)
            + f". Fix: add an <exclusion> for it to {where}."
        )


def _cached(cache: Path, digest: str) -> list[Path] | None:
    try:
        header, *lines = cache.read_text().splitlines()
    except (FileNotFoundError, ValueError):
        return None
    jars = [Path(line) for line in lines]
    if header != f"# pom sha256 {digest}" or not all(jar.is_file() for jar in jars):
        return None  # the POM changed, or ~/.m2 was cleaned
    return jars


def _store(cache: Path, digest: str, jars: list[Path]) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text("\n".join([f"# pom sha256 {digest}", *map(str, jars)]) + "\n")
    tmp.replace(cache)  # atomic: a concurrent reader sees the old list or the new one


def _resolve(group: str, pom: Path) -> list[Path]:
    what = GROUPS[group].description if group in GROUPS else group
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JvmError(
            f"Maven (mvn) is not installed: it fetches {what} for the JVM group {group!r}. "
            "Install it (Debian/Ubuntu: `apt-get install -y maven`), then run `python -m devtools.jvm`."
        )
    with tempfile.TemporaryDirectory(prefix="jvm-classpath-") as tmp:
        out = Path(tmp) / "classpath"
        command = [
            mvn,
            "--batch-mode",
            "--quiet",
            "--file",
            str(pom),
            f"{DEPENDENCY_PLUGIN}:build-classpath",
            f"-Dmdep.outputFile={out}",
            "-Dmdep.includeScope=runtime",  # compile + runtime: what runs, never test or provided
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_SECONDS, check=False, cwd=tmp
            )
        except subprocess.TimeoutExpired as e:
            raise JvmError(
                f"Maven did not resolve {what} (JVM group {group!r}) within {MAVEN_TIMEOUT_SECONDS} s: "
                "check the network access to Maven Central, then run `python -m devtools.jvm` again."
            ) from e
        if result.returncode != 0 or not out.is_file():
            raise JvmError(_maven_failure(group, what, pom, result.stdout + result.stderr))
        text = out.read_text().strip()
    return [Path(entry) for entry in text.split(os.pathsep) if entry]


def _maven_failure(group: str, what: str, pom: Path, output: str) -> str:
    lines = [_ANSI_CODE.sub("", line) for line in output.splitlines()]
    errors = [line.removeprefix("[ERROR]").split(" -> [Help")[0].strip() for line in lines if "[ERROR]" in line[:8]]
    detail = " ".join(e for e in errors if e and not e.startswith(_MAVEN_BOILERPLATE)) or output.strip()[-2000:]
    if re.search(r"transfer|resolve|offline|connect|unknown host|not found|was cached", detail, re.IGNORECASE):
        fix = (
            "check the network access to Maven Central (or the mirror in ~/.m2/settings.xml) and that the "
            f"versions in {pom} are served, then run `python -m devtools.jvm`; Maven remembers a failed "
            "download for a day: delete the artifact's *.lastUpdated files under ~/.m2/repository to retry now"
        )
    else:
        fix = f"check {pom}"
    return f"Maven could not resolve {what} (JVM group {group!r}): {detail.rstrip('.')}. Fix: {fix}."


def _megabytes(jars: list[Path]) -> float:
    return sum(jar.stat().st_size for jar in jars) / 1e6


def main(argv: list[str]) -> int:
    groups = argv or list(GROUPS)
    for group in groups:
        try:
            if not is_resolved(group):
                print(
                    f"jvm: {group}: resolving with Maven into ~/.m2 (the first time downloads its jars) ...", flush=True
                )
            jars = classpath(group)
            if group in GROUPS and GROUPS[group].on_spark:
                link(group)
        except JvmError as e:
            print(f"jvm: {group}: {e}", file=sys.stderr)
            return 1
        print(f"jvm: {group}: {len(jars)} jars, {_megabytes(jars):.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
