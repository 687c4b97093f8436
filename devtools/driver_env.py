"""The Python environment a driver runs with in a YARN container, packed as an archive that Spark unpacks beside
the driver (docs/clusters.md, "Shipping the runtime"):

    archive = pack(directory)   # <directory>/savepoints-env.tar.gz
    conf = {"spark.archives": f"{uri_of_archive}#environment", "spark.pyspark.python": "./environment/bin/python"}

It holds this project (installed from its source, not as a link to it) with its [hdfs] extra, at the versions
uv.lock pins, and no pyspark: Spark ships its own pyspark.zip and py4j to every YARN container, and a second
pyspark of another version would not match the cluster's jars. A virtual environment's `bin/python` links to the
interpreter it was made from, so the cluster's nodes need that Python at the same path (venv-pack's rule too):
true of this machine's one-node mini cluster; elsewhere make the environment from the Python the nodes have, or
pack a conda environment (conda-pack), which carries its interpreter.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHIVE = "savepoints-env.tar.gz"
EXTRAS = ("hdfs",)  # the runtime reads an hdfs:// checkpoint before it starts the query


class DriverEnvError(RuntimeError):
    """The environment could not be made (uv missing, a package not installable)."""


def _uv() -> list[str]:
    """uv, as the Makefile finds it: on PATH, else the module of the Python that runs `make`."""
    found = shutil.which("uv")
    return [found] if found else ["python3", "-m", "uv"]


def _run(command: list[str], what: str) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriverEnvError(f"{what} failed ({exc}): `make setup` installs uv") from None
    if result.returncode != 0:
        raise DriverEnvError(f"{what} failed (exit {result.returncode}):\n{result.stderr.strip()[-2000:]}")
    return result.stdout


def pack(directory: Path) -> Path:
    """Make the environment in `directory/env` and pack it into `directory/savepoints-env.tar.gz`."""
    env = directory / "env"
    shutil.rmtree(env, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    uv = _uv()
    _run([*uv, "venv", "--quiet", "--python", sys.executable, str(env)], "making the driver environment")
    requirements = directory / "requirements.txt"
    extras = [arg for extra in EXTRAS for arg in ("--extra", extra)]
    _run(
        [*uv, "export", "--frozen", "--no-dev", *extras, "--no-emit-project", "--no-hashes", "-o", str(requirements)],
        "listing the driver environment's packages from uv.lock",
    )
    python = str(env / "bin" / "python")
    _run([*uv, "pip", "install", "--quiet", "--python", python, "-r", str(requirements)], "installing its packages")
    _run([*uv, "pip", "install", "--quiet", "--python", python, "--no-deps", str(REPO)], "installing spark-savepoints")
    archive = directory / ARCHIVE
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:  # fast: it travels on loopback
        for item in sorted(env.iterdir()):
            tar.add(item, arcname=item.name)
    return archive
