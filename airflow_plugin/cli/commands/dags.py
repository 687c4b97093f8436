"""Airflow: put the example DAGs (and the example jobs file they read) into a DAGs folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ...core.jobs.context import Context
from ...dags_folder import install_dags
from ..render import Output, say


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    install = commands.add_parser(
        "install-dags",
        parents=[common],
        help="copy the savepoints DAGs and the example jobs file into an Airflow DAGs folder",
        description="Copy the savepoints DAGs into DAGS_FOLDER/savepoints/ (created if missing; earlier copies are "
        "replaced), with the example jobs file next to them unless a jobs.toml is already there. The DAGs read "
        "that jobs.toml, or the file $SAVEPOINTS_JOBS names in the environment of Airflow's processes.",
    )
    install.add_argument("dags_folder", metavar="DAGS_FOLDER", type=Path, help="Airflow's [core] dags_folder")
    install.set_defaults(run=run_install_dags)


def run_install_dags(args: argparse.Namespace, ctx: Context) -> Output:
    installed = install_dags(args.dags_folder)

    def human() -> None:
        for name, what in installed.dags.items():
            say(f"{what:9} {installed.folder / name}")
        kept = "kept (yours)" if installed.jobs_file_kept else "added (the example jobs; edit it for yours)"
        say(f"{'':9} jobs file {installed.jobs_file}: {kept}")
        say("Airflow picks the DAGs up at its next scan of the DAGs folder (`airflow dags list` shows them)")

    return Output(installed.to_dict(), human)
