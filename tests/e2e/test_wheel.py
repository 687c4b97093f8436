"""The wheel, installed as a user installs it into an Airflow they already run: a fresh virtualenv with an
older supported Airflow 3 installed (and its metadata DB migrated) first, then the README's own install
block (`# checked by tests/e2e/test_wheel.py`), with `uv pip` for `pip` so that uv's cache serves every
package after the first run. Airflow keeps its version, `pip check` passes, pyspark imports the version its
metadata claims (pyspark-client, which the Spark provider brings, shares its files), the DAGs installed by
`savepoints install-dags` import without errors and the plugin loads.

One slow test: building, resolving and installing Airflow and pyspark takes minutes even from the cache."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_docs import REPO, blocks, commands

pytestmark = [pytest.mark.slow]

OLDER_AIRFLOW = "3.1.8"  # the newest 3.1: the oldest minor version the metadata admits (>=3.1)
MARKER = "# checked by tests/e2e/test_wheel.py"
# a user's shell holds none of ours, and nothing that tells uv to install elsewhere than the active venv:
# `python -m uv` (how make runs uv before it is on PATH) exports UV_INTERNAL__PARENT_INTERPRETER to all below it,
# and `uv pip install` then installs into that interpreter (a CI found Airflow 3.1.8 in its system Python)
NOT_IN_A_USERS_SHELL = ("AIRFLOW", "SAVEPOINTS_", "VIRTUAL_ENV", "UV_INTERNAL__")
TARGET_CHOOSERS = ("UV_PYTHON", "UV_PROJECT_ENVIRONMENT", "UV_SYSTEM_PYTHON", "CONDA_PREFIX", "PYTHONHOME")
SOURCES = ("pyproject.toml", "README.md", "jobs.toml", "airflow_plugin", "spark_jobs", "dags")


def install_block() -> list[str]:
    [block] = [b for b in blocks(REPO / "README.md") if b.first_line.startswith(MARKER)]
    return [command for command, _ in commands(block.body)]


@pytest.mark.timeout(2400)  # installs Airflow and pyspark: minutes, even from uv's cache
def test_the_wheel_installs_into_an_older_airflow_and_keeps_it(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH (make setup installs it)"
    clone = tmp_path / "clone"  # what the block's `uv build` builds: the project's sources, nothing else
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, clone / name, ignore=shutil.ignore_patterns("__pycache__", ".runs"))
        else:
            clone.mkdir(exist_ok=True)
            shutil.copyfile(source, clone / name)
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(NOT_IN_A_USERS_SHELL) and k not in TARGET_CHOOSERS}
    env |= {
        "VIRTUAL_ENV": str(venv),
        "PATH": os.pathsep.join([str(venv / "bin"), os.environ.get("PATH", "")]),
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }

    # the user's Airflow, there before this project: an older supported version, its metadata DB migrated
    for command in (f"uv pip install apache-airflow=={OLDER_AIRFLOW}", "airflow db migrate"):
        done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"{command}:\n{(done.stdout + done.stderr)[-3000:]}"
        assert (venv / "bin" / "airflow").exists(), f"`{command}` installed outside {venv}: see NOT_IN_A_USERS_SHELL"
    steps = install_block()
    assert any("spark_savepoints" in step and "[airflow,spark]" in step for step in steps), steps
    for step in steps:
        command = re.sub(r"^pip ", "uv pip ", step)  # the block's pip, through uv's cache
        result = subprocess.run(
            ["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True, timeout=1800
        )
        output = (result.stdout + result.stderr)[-4000:]
        assert result.returncode == 0, f"README's install step `{step}` failed:\n{output}"

    python = str(venv / "bin" / "python")
    probe = (
        "import importlib.metadata as m, json, airflow, pyspark; "
        "from airflow_plugin.operators import SavepointOperator; "
        "print(json.dumps({'airflow': airflow.__version__, 'pyspark': pyspark.__version__, "
        "'pyspark_dist': m.version('pyspark'), 'pyspark_client': m.version('pyspark-client')}))"
    )
    probed = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True)
    assert probed.returncode == 0, f"the installed package does not import:\n{probed.stderr[-3000:]}"
    found = json.loads(probed.stdout)
    assert found["airflow"] == OLDER_AIRFLOW, f"installing the wheel replaced the user's Airflow: {found}"
    assert found["pyspark"] == found["pyspark_dist"] == found["pyspark_client"], found

    plugins = subprocess.run(
        [str(venv / "bin" / "airflow"), "plugins", "--output", "json"], env=env, capture_output=True, text=True
    )
    assert plugins.returncode == 0, plugins.stderr[-3000:]
    assert '"savepoints"' in plugins.stdout, plugins.stdout[-3000:]
    dags = Path(env["AIRFLOW_HOME"]) / "dags" / "savepoints"
    assert sorted(p.name for p in dags.glob("savepoints_*.py")) == sorted(p.name for p in (REPO / "dags").glob("*.py"))
