"""Every command block in README.md and docs/*.md runs as written, and every jobs file and Python block in
them is valid: the docs are part of the product.

The blocks run in document order (README.md, docs/operations.md, then the other pages by name), each in a
fresh bash, in one scratch directory that stands for a clone of this repository: a copy of its jobs.toml,
its devtools/ and spark_jobs/ linked in, `.venv/bin` first on PATH (as the README's "Your own job" says),
boto3 pointed at the embedded S3 server (moto on 127.0.0.1) with the buckets the examples name (`my-bucket`;
`lake` holding a checkpoint at checkpoints/orders). Later blocks build on what earlier ones did (the runbook's
upgrade follows the README's deployment), as a reader following the pages would.

The README's "Your own job" is followed with a script of the reader's own: the example job's versions the
pages use (v1, v2, v3) run tests/scripts/counts.py, written as a user writes a streaming script, importing
nothing of this project, instead of the example's code. Once every block ran, its output holds each (user,
window) once, with exactly the events fed for it.

Conventions a reader can see:

- a block whose first line is `# illustrative...` (it needs your cluster or your credentials) or
  `# checked by tests/...` (another test runs it, e.g. the install into a fresh virtualenv) is not run;
- a command is expected to succeed unless its comment says `exit code N`;
- `make ...` lines are checked with `make -n` (the target exists): `make test` is CI itself, and `make
  demo`'s lifecycle is tests/e2e/test_dags_e2e.py;
- a block whose first line is `# file: NAME` (Python or TOML) is saved as NAME before the shell blocks of
  its page run; other ```toml blocks that declare jobs are parsed as jobs files, other Python blocks
  compiled.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from airflow_plugin.core.autoscale.policy import Autoscale
from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import live_deployments
from airflow_plugin.core.jobs.spec import load_jobs
from airflow_plugin.core.jobs.stop import kill
from devtools.embedded_s3 import EmbeddedS3
from tests.support.synthetic import write_checkpoint

REPO = Path(__file__).resolve().parents[1]
SHELL = ("bash", "sh", "shell", "console")
NOT_RUN = ("# illustrative", "# checked by tests/")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_EXPECTED = re.compile(r"exit code (\d+)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.body.lstrip().splitlines()[0] if self.body.strip() else ""

    @property
    def file_name(self) -> str | None:
        match = re.match(r"#\s*file:\s*(\S+)", self.first_line)
        return match.group(1) if match else None


def pages() -> list[Path]:
    """README, the runbook (it continues the README's deployment), then every other page by name."""
    first = [REPO / "README.md", REPO / "docs" / "operations.md"]
    return first + sorted(p for p in (REPO / "docs").glob("*.md") if p not in first)


def blocks(page: Path) -> Iterator[Block]:
    text = page.read_text()
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        yield Block(page, line, match.group("lang").lower(), textwrap.dedent(match.group("body")))


def commands(body: str) -> Iterator[tuple[str, int]]:
    """The block's commands (continuation lines joined) with the exit code each is expected to end with."""
    pending = ""
    for raw in body.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if not command or command.startswith("#"):
            continue
        comment = command.split(" # ", 1)[1] if " # " in command else ""
        expected = _EXPECTED.search(comment)
        yield command, int(expected.group(1)) if expected else 0


def script(block: Block) -> str:
    """Bash that runs each command and stops at the first whose exit code is not the expected one."""
    lines = ["set -u"]
    for number, (command, expected) in enumerate(commands(block.body)):
        if command.startswith("make "):
            command = f"make -n -C {REPO} " + command.removeprefix("make ")
        lines += [
            command,
            f"rc=$?; if [ $rc -ne {expected} ]; then "
            f"echo 'FAILED (exit '$rc', expected {expected}): command {number + 1} of {block.where}' >&2; exit 97; fi",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("docs")
    (root / "jobs.toml").write_text(_with_own_script(REPO / "jobs.toml"))
    shutil.copyfile(OWN_SCRIPT, root / OWN_SCRIPT.name)
    for linked in ("devtools", "spark_jobs"):
        (root / linked).symlink_to(REPO / linked)
    s3_server.create_bucket("my-bucket")
    lake = s3_server.create_bucket("lake")
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("orders-checkpoint"), batches=3)
    client = s3_server.client()
    bucket = lake.removeprefix("s3://").split("/")[0]
    for file in checkpoint.rglob("*"):
        if file.is_file():
            client.upload_file(str(file), bucket, f"checkpoints/orders/{file.relative_to(checkpoint)}")
    try:
        yield root
    finally:
        _stop_what_the_docs_left_running(root)


OWN_SCRIPT = REPO / "tests" / "scripts" / "counts.py"
# the example job's versions that the pages run, as a reader declares their own script: v3 groups by a new key
OWN_VERSIONS = {
    "v1": '{ script = "counts.py", args = ["--tag", "v1"] }',
    "v2": '{ script = "counts.py", args = ["--tag", "v2"] }',
    "v3": '{ script = "counts.py", args = ["--by", "user,country", "--tag", "v3"] }',
}


def _with_own_script(jobs: Path) -> str:
    """The example jobs file with the example job's versions the pages use running the reader's own script."""
    text, job = jobs.read_text(), "[jobs.windowed_counts]"
    head, rest = text.split(job, 1)
    table, tail = rest.split("\n[", 1)
    for version, declared in OWN_VERSIONS.items():
        table, found = re.subn(rf"^versions\.{version} = .*$", f"versions.{version} = {declared}", table, flags=re.M)
        assert found == 1, f"jobs.toml's {job} no longer declares {version}"
    return f"{head}{job}{table}\n[{tail}"


def _counted_once(root: Path) -> int:
    """Every (user, window) in the example job's committed output once, with exactly the events fed for it (the
    windows the watermark closed: the rest are still open); how many rows were checked."""
    from collections import Counter
    from datetime import datetime

    from spark_jobs.jobs.windowed.output import read_output, summarize

    fed: Counter[tuple[str, str]] = Counter()
    for file in (root / ".runs" / "input" / "windowed_counts").glob("*.json"):
        for line in filter(None, file.read_text().splitlines()):
            event = json.loads(line)
            minute = datetime.fromisoformat(event["event_time"]).replace(second=0, microsecond=0)
            fed[event["user"], minute.isoformat()] += 1
    rows = read_output(root / ".runs" / "output" / "windowed_counts")
    assert summarize(rows).duplicates == [], f"(user, window) written twice: {summarize(rows).duplicates[:5]}"
    for row in rows:
        window = datetime.fromisoformat(row["window_start"]).isoformat()
        assert row["events"] == fed[row["user"], window], f"{row}: {fed[row['user'], window]} events fed"
    return len(rows)


def _stop_what_the_docs_left_running(root: Path) -> None:
    for jobs_file in root.glob("*.toml"):
        try:
            context = Settings(jobs_file=str(jobs_file)).resolve()
            for name in context.jobs:
                if live_deployments(context.job(name)):
                    kill(context.job(name))
        except SavepointsError:
            continue


def _environment(s3_server: EmbeddedS3) -> dict[str, str]:
    """A reader's shell: nothing of this test session's settings, the venv's commands first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAVEPOINTS_", "AIRFLOW", "AWS_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(s3_server.env())
    return env


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(2700)  # about ten Spark drivers one after the other: 5 minutes on 2 quiet cores
def test_every_command_block_runs_as_written(scratch: Path, s3_server: EmbeddedS3) -> None:
    env = _environment(s3_server)
    ran = 0
    for page in pages():
        found = list(blocks(page))
        for block in found:
            if block.file_name:
                (scratch / block.file_name).write_text(block.body)
        for block in found:
            if block.lang not in SHELL or block.first_line.startswith(NOT_RUN):
                continue
            result = subprocess.run(
                ["bash", "-c", script(block)], cwd=scratch, env=env, capture_output=True, text=True, timeout=1200
            )
            ran += 1
            if result.returncode != 0:
                output = "\n".join((result.stdout + result.stderr).strip().splitlines()[-40:])
                pytest.fail(f"the command block at {block.where} does not run as written:\n{output}", pytrace=False)
    assert ran >= 8, f"only {ran} command blocks ran: did the pages or their markers change?"
    assert _counted_once(scratch) >= 20, "the example job emitted fewer windows than the pages' input closes"


def test_every_jobs_file_and_python_block_is_valid(tmp_path: Path) -> None:
    checked = 0
    for page in pages():
        for block in blocks(page):
            if block.lang == "toml" and "[jobs." in block.body:
                jobs = tmp_path / f"{page.stem}-{block.line}.toml"
                jobs.write_text(block.body)
                assert load_jobs(str(jobs)), f"{block.where} declares no job"
                checked += 1
            elif block.lang == "python":
                compile(block.body, block.where, "exec")
                checked += 1
    assert checked >= 5, f"only {checked} jobs file and Python blocks found"


def test_no_page_links_outside_the_repository() -> None:
    """The docs stand alone: no link to files a reader of this repository does not have."""
    for page in pages():
        for target in re.findall(r"\]\(([^)#]+)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).resolve().is_relative_to(REPO), f"{page.name} links {target}"
            assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"


def test_the_jobs_file_page_gives_every_autoscale_key_with_its_default(tmp_path: Path) -> None:
    """jobs-file.md's complete example sets every key of `autoscale` (core/autoscale/policy.py) to its default, and
    its keys table names each: a key added, renamed or given another default fails here until the page says so."""
    page = REPO / "docs" / "jobs-file.md"
    example = next(b for b in blocks(page) if b.lang == "toml" and "every key" in b.first_line)
    (tmp_path / "jobs.toml").write_text(example.body)
    declared = [spec.autoscale for spec in load_jobs(str(tmp_path / "jobs.toml")).values() if spec.autoscale]
    assert len(declared) == 1, "the complete example declares one autoscaler"
    [policy] = declared
    assert policy == Autoscale(max=policy.max, knob=policy.knob), "the example's values are the defaults"
    table = re.search(r"^\| `autoscale` \|.*$", page.read_text(), re.M)
    assert table is not None, "the keys table has no autoscale row"
    for key in (f.name for f in fields(Autoscale)):
        assert re.search(rf"^{key} = ", example.body, re.M), f"the example does not set autoscale.{key}"
        assert f"`{key}`" in table.group(0), f"the keys table does not name autoscale.{key}"
