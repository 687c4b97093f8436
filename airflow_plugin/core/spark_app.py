"""Starts the Spark applications the engine needs (deep verify, pre-flight) as their own processes:
the engine never imports pyspark. The scripts live in spark_jobs/tools/."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import LaunchFailed, SparkToolFailed

SPARK_MASTER_ENV = "SAVEPOINTS_SPARK_MASTER"


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


def run_spark_tool(
    name: str,
    args: list[str],
    *,
    conf: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 900,
) -> str:
    """Run spark_jobs/tools/<name>.py with spark-submit and return its stdout; fail with its stderr tail."""
    command = [spark_submit_binary(), "--master", os.environ.get(SPARK_MASTER_ENV, "local[2]")]
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        **(conf or {}),
    }.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(tool_path(name)), *args]
    child = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, **(env or {})}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=child, check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise SparkToolFailed(f"Spark tool {name} failed (exit {result.returncode}):\n{tail}")
    return result.stdout
