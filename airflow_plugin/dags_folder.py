"""The example DAGs and jobs file this package ships (the wheel holds them in airflow_plugin/example_dags/,
as providers ship example DAGs; a source checkout has them in dags/ and jobs.toml), and the one way to put
them into an Airflow DAGs folder: `savepoints install-dags DAGS_FOLDER`.

    DAGS_FOLDER/savepoints/savepoints_*.py   the DAGs (replaced by this package's on every install)
    DAGS_FOLDER/savepoints/jobs.toml         the example jobs; the DAGs read it unless $SAVEPOINTS_JOBS says
                                             otherwise (an existing one is never replaced)
    DAGS_FOLDER/savepoints/.airflowignore    keeps the DAG processor out of the example's data (.runs/)

A jobs file whose store is a local path belongs to one machine: under an executor whose tasks run on other machines
(Celery, Kubernetes, ...) each worker would have a store of its own, so the install is refused, saying what to set.
Pure Python: Airflow's configuration is read only to know its executor."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .core.errors import InvalidInput, NotFound, Refused
from .core.jobs.spec import DEFAULT_JOBS_FILE, JOBS_ENV, load_jobs

PACKAGED = Path(__file__).parent / "example_dags"  # in the wheel
CHECKOUT = Path(__file__).resolve().parents[1]  # a source checkout: dags/ and jobs.toml
SUBFOLDER = "savepoints"
IGNORE = ".runs/\n"  # the example jobs file keeps its store, checkpoints and logs there
LOCAL_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})  # tasks on this machine only


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
    dags, jobs = example_files()
    kept = target / DEFAULT_JOBS_FILE
    _refuse_a_local_store(Path(os.environ.get(JOBS_ENV) or (kept if kept.exists() else jobs)), configured_executor())
    target.mkdir(parents=True, exist_ok=True)
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


def configured_executor() -> str | None:
    """Airflow's executor setting ([core] executor, perhaps several, comma-separated); None where unknown."""
    if value := os.environ.get("AIRFLOW__CORE__EXECUTOR"):
        return value
    try:
        from .compat import conf

        return str(conf.get("core", "executor"))
    except Exception:  # no Airflow here: nothing says the tasks run elsewhere
        return None


def _refuse_a_local_store(jobs_file: Path, executor: str | None) -> None:
    """Refused, nothing written: the DAGs would read a jobs file whose store is a local path while Airflow's
    executor runs tasks on other machines."""
    names = [name.strip().rsplit(".", 1)[-1].split(":")[-1] for name in (executor or "").split(",") if name.strip()]
    distributed = [name for name in names if name not in LOCAL_EXECUTORS]
    if not distributed:
        return
    local = {
        name: spec.store
        for name, spec in load_jobs(str(jobs_file)).items()
        if spec.store and ("://" not in spec.store or spec.store.startswith("file:"))
    }
    if local:
        stores = ", ".join(f"{name}: {store}" for name, store in sorted(local.items()))
        raise Refused(
            f"the jobs file {jobs_file} keeps the store of {stores} in a local path, but Airflow's executor "
            f"({', '.join(distributed)}) runs tasks on other machines, each with a disk of its own: give the jobs a "
            f'store every worker reaches (store = "s3://bucket/prefix": jobs-file.md) in that file, or point '
            f"${JOBS_ENV} of Airflow's processes at such a jobs file, then install again. Nothing was written"
        )
