"""Starts the Spark applications the engine needs (deep verify, pre-flight) as their own processes:
the engine never imports pyspark. The scripts live in spark_jobs/tools/."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import SavepointsError

SPARK_MASTER_ENV = "SAVEPOINTS_SPARK_MASTER"


class SparkAppFailed(SavepointsError):
    exit_code = 8


def tool_path(name: str) -> Path:
    spec = importlib.util.find_spec("spark_jobs")
    if spec is None or not spec.submodule_search_locations:
        raise SparkAppFailed("the spark_jobs package is not installed: install spark-savepoints with its [spark] extra")
    return Path(next(iter(spec.submodule_search_locations))) / "tools" / f"{name}.py"


def spark_submit() -> str:
    found = shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")
    if not Path(found).exists():
        raise SparkAppFailed("spark-submit not found: install pyspark (the [spark] extra) or put Spark on PATH")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SparkAppFailed("Java is not installed: Spark needs Java 17 (set JAVA_HOME or put java on PATH)")
    return found


def run_spark_tool(name: str, args: list[str], *, conf: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run spark_jobs/tools/<name>.py with spark-submit and return its stdout; fail with its stderr tail."""
    command = [spark_submit(), "--master", os.environ.get(SPARK_MASTER_ENV, "local[2]")]
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        **(conf or {}),
    }.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(tool_path(name)), *args]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise SparkAppFailed(f"Spark tool {name} failed (exit {result.returncode}):\n{tail}")
    return result.stdout
