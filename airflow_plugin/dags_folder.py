"""The example DAGs and jobs file this package ships (the wheel holds them in airflow_plugin/example_dags/,
as providers ship example DAGs; a source checkout has them in dags/ and jobs.toml), and the one way to put
them into an Airflow DAGs folder: `savepoints install-dags DAGS_FOLDER`.

    DAGS_FOLDER/savepoints/savepoints_*.py   the DAGs (replaced by this package's on every install)
    DAGS_FOLDER/savepoints/jobs.toml         the example jobs; the DAGs read it unless $SAVEPOINTS_JOBS says
                                             otherwise (an existing one is never replaced)
    DAGS_FOLDER/savepoints/.airflowignore    keeps the DAG processor out of the example's data (.runs/)

Pure Python, no Airflow needed: it only copies files."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .core.errors import InvalidInput, NotFound
from .core.jobs.spec import DEFAULT_JOBS_FILE

PACKAGED = Path(__file__).parent / "example_dags"  # in the wheel
CHECKOUT = Path(__file__).resolve().parents[1]  # a source checkout: dags/ and jobs.toml
SUBFOLDER = "savepoints"
IGNORE = ".runs/\n"  # the example jobs file keeps its store, checkpoints and logs there


@dataclass
class Installed:
    folder: Path
    dags: dict[str, str] = field(default_factory=dict)  # file name -> "added", "updated" or "unchanged"
    jobs_file: Path | None = None
    jobs_file_kept: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "folder": str(self.folder),
            "dags": self.dags,
            "jobs_file": str(self.jobs_file),
            "jobs_file_kept": self.jobs_file_kept,
        }


def example_files() -> tuple[list[Path], Path]:
    """The DAG files and the example jobs file, from the installed wheel or the source checkout."""
    if PACKAGED.is_dir():
        dags, jobs = PACKAGED, PACKAGED / DEFAULT_JOBS_FILE
    else:
        dags, jobs = CHECKOUT / "dags", CHECKOUT / DEFAULT_JOBS_FILE
    found = sorted(dags.glob("savepoints_*.py"))
    if not found or not jobs.is_file():
        raise NotFound(f"the example DAGs are missing from {dags}: reinstall spark-savepoints")
    return found, jobs


def install_dags(dags_folder: Path) -> Installed:
    """Copy the DAGs into `dags_folder`/savepoints/, with the example jobs file unless one is there."""
    if dags_folder.exists() and not dags_folder.is_dir():
        raise InvalidInput(
            f"{dags_folder} is a file, not a DAGs folder: give Airflow's dags_folder "
            "(`airflow config get-value core dags_folder`)"
        )
    target = dags_folder / SUBFOLDER
    if target.exists() and not target.is_dir():
        raise InvalidInput(f"{target} is a file, not a folder: move it away first")
    target.mkdir(parents=True, exist_ok=True)
    dags, jobs = example_files()
    installed = Installed(target)
    for source in dags:
        destination = target / source.name
        before = destination.read_bytes() if destination.exists() else None
        if before != source.read_bytes():
            shutil.copyfile(source, destination)
        installed.dags[source.name] = (
            "added" if before is None else "unchanged" if before == source.read_bytes() else "updated"
        )
    installed.jobs_file = target / DEFAULT_JOBS_FILE
    installed.jobs_file_kept = installed.jobs_file.exists()
    if not installed.jobs_file_kept:
        shutil.copyfile(jobs, installed.jobs_file)
    ignore = target / ".airflowignore"
    if not ignore.exists():
        ignore.write_text(IGNORE)
    return installed
