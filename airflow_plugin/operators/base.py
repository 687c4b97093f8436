"""What every savepoints operator shares: the hook (jobs file, AWS and Spark connections), the job by
name, and errors as Airflow understands them: bad input and refusals fail the task without retries
(a retry cannot fix an unknown job); anything else (an unreachable store) may be retried."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from enum import StrEnum
from functools import cached_property
from typing import Any, TypeVar

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

from ..core.errors import InvalidInput, NotFound, Refused
from ..core.jobs.spec import JobSpec
from ..core.progress import LogProgress
from ..core.snapshots.store import SnapshotStore
from ..hooks.savepoints import SavepointsHook


class SavepointsBaseOperator(BaseOperator):
    """Calls `run(job, store, context)` inside the hook's engine context."""

    template_fields: Sequence[str] = ("job",)
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        job: str,
        aws_conn_id: str | None = SavepointsHook.default_conn_name,
        spark_conn_id: str | None = "spark_default",
        jobs_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.aws_conn_id = aws_conn_id
        self.spark_conn_id = spark_conn_id
        self.jobs_file = jobs_file

    @cached_property
    def hook(self) -> SavepointsHook:
        return SavepointsHook(aws_conn_id=self.aws_conn_id, spark_conn_id=self.spark_conn_id, jobs_file=self.jobs_file)

    @cached_property
    def progress(self) -> LogProgress:
        return LogProgress()

    def execute(self, context: Context) -> Any:
        try:
            with self.hook.engine():
                job = self.hook.job(self.job)
                return self.run(job, self.hook.store(job), context)
        except (InvalidInput, NotFound, Refused) as exc:
            raise AirflowFailException(str(exc)) from exc

    @abstractmethod
    def run(self, job: JobSpec, store: SnapshotStore, context: Context) -> Any:
        """The operator's one engine call; its return value is the task's XCom."""

    @staticmethod
    def requested_by(context: Context) -> str:
        """Who asks, as recorded in manifests and control requests."""
        return f"airflow:{context['ti'].dag_id}/{context['ti'].task_id}"


def flag(value: object) -> bool:
    """A templated boolean: a real bool (native rendering) or its rendered text ("True", "false", ...);
    `bool("False")` would be True."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1", "yes")


E = TypeVar("E", bound=StrEnum)


def choice(kind: type[E], value: object, what: str) -> E:
    """A templated enum value, or bad input that lists the valid ones."""
    try:
        return kind(str(value))
    except ValueError:
        raise InvalidInput(f"invalid {what} {value!r}: use one of {', '.join(k.value for k in kind)}") from None
