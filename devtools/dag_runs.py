"""Run this project's DAGs in-process with `dag.test()` (real tasks, real triggers, the metadata DB of
`airflow_env`) and read back what each task did: its state, its return value (XCom) and its error."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from devtools.airflow_env import DAGS_FOLDER


@dataclass
class DagRunResult:
    dag_id: str
    run_id: str
    state: str
    seconds: float
    tasks: dict[str, str] = field(default_factory=dict)  # task id -> state
    returned: dict[str, Any] = field(default_factory=dict)  # task id -> return value
    pushed: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> other XComs it pushed, by key
    links: dict[str, dict[str, str]] = field(default_factory=dict)  # task id -> extra link name -> URL

    @property
    def succeeded(self) -> bool:
        return self.state == "success"

    def value(self, task_id: str) -> Any:
        if task_id not in self.returned:
            raise KeyError(f"task {task_id} of {self.dag_id} returned nothing (states: {self.tasks})")
        return self.returned[task_id]


def load_dags() -> Any:
    """This project's DAGs for the current jobs file (parsed once per file), with Airflow's models loaded
    and mapped: call it before starting threads that use the metadata DB (lazy imports deadlock)."""
    from airflow.models import import_all_models
    from sqlalchemy.orm import configure_mappers

    from airflow_plugin.dag_params import dag_jobs_file

    import_all_models()
    configure_mappers()
    return _dagbag(dag_jobs_file())


@cache
def _dagbag(jobs_file: str) -> Any:  # the DAGs' forms and tasks depend on the jobs file: one bag per file
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    if bag.import_errors:
        raise RuntimeError(f"DAG import errors: {bag.import_errors}")
    return bag


def run_dag(dag_id: str, conf: dict[str, Any], *, mark_success: str | None = None) -> DagRunResult:
    """One run of `dag_id` with `conf`; returns when every task is done (failed tasks do not raise).
    Tasks whose id matches the regex `mark_success` are marked successful instead of run."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dag = load_dags().get_dag(dag_id)
    started = time.monotonic()
    run = dag.test(run_conf=conf, mark_success_pattern=mark_success)
    result = DagRunResult(dag_id, run.run_id, str(run.state), time.monotonic() - started)
    with create_session() as session:
        for ti in run.get_task_instances(session=session):
            result.tasks[ti.task_id] = str(ti.state)
        query = XComModel.get_many(run_id=run.run_id, dag_ids=dag_id)
        for row in session.scalars(select(XComModel).from_statement(query)):
            if row.key == "return_value":
                result.returned[row.task_id] = XComModel.deserialize_value(row)
            elif row.key.startswith("_link_"):  # what the worker computed for the operator's extra links
                result.links.setdefault(row.task_id, {})[row.key.removeprefix("_link_")] = XComModel.deserialize_value(
                    row
                )
            else:
                result.pushed.setdefault(row.task_id, {})[row.key] = XComModel.deserialize_value(row)
    logging.getLogger(__name__).info("%s %s: %s %s", dag_id, run.run_id, result.state, result.tasks)
    return result
