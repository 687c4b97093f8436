"""What every savepoints operator and sensor shares, written once (the amazon provider's AwsBaseOperator
and its mixins): the job, connection and jobs file arguments and their template field, the hook built
lazily from them, the job's resolved context, and errors as Airflow understands them: bad input and
refusals fail the task without retries (a retry cannot fix an unknown job); anything else (an unreachable
store) may be retried."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from functools import cached_property
from typing import Any, TypeVar

from airflow.sdk import BaseOperator, Context

from .. import stats
from ..compat import AirflowFailException
from ..core.errors import InvalidInput, NotFound, Refused
from ..core.jobs.context import JobContext
from ..core.lease import DEFAULT_TTL, airflow_holder
from ..core.progress import LogProgress
from ..hooks.savepoints import DEFAULT_KAFKA_CONN, SavepointsHook

DEFAULT_SPARK_CONN = "spark_default"


class SavepointsMixin:
    """The job a task acts on and where its configuration comes from. Subclasses list their own
    template fields after `("job",)`; the hook is built on first use, inside `execute`."""

    keep_lease = False  # True: the job's lease outlives the task, for the next step of the same DAG run
    lease_ttl = DEFAULT_TTL

    def _savepoints_args(
        self,
        job: str,
        aws_conn_id: str | None,
        spark_conn_id: str | None,
        jobs_file: str | None,
        kafka_conn_id: str | None = DEFAULT_KAFKA_CONN,
    ) -> None:
        self.job = job
        self.aws_conn_id = aws_conn_id
        self.spark_conn_id = spark_conn_id
        self.jobs_file = jobs_file
        self.kafka_conn_id = kafka_conn_id

    @cached_property
    def hook(self) -> SavepointsHook:
        return SavepointsHook(
            aws_conn_id=self.aws_conn_id,
            spark_conn_id=self.spark_conn_id,
            jobs_file=self.jobs_file,
            kafka_conn_id=self.kafka_conn_id,
        )

    def job_context(self, context: Context) -> JobContext:
        return self.hook.job_context(
            self.job,
            requested_by=requested_by(context),
            request_id=task_request_id(context),
            progress=LogProgress(),
            holder=lease_holder(context),
            keep_lease=self.keep_lease,
            lease_ttl=self.lease_ttl,
        )


@contextmanager
def task_errors(context: Context | None = None, job: str | None = None) -> Iterator[None]:
    """Engine errors no retry can fix (bad input, unknown names, refusals) fail the task at once, counted by
    their class (stats.REFUSED); with the task's `context` the message is also its XCom `error`, for whoever
    reads the run (the page, a test)."""
    try:
        yield
    except (InvalidInput, NotFound, Refused) as exc:
        stats.refused(job or "", type(exc).__name__)
        if context is not None:
            context["ti"].xcom_push(key="error", value=str(exc))
        raise AirflowFailException(str(exc)) from exc


def requested_by(context: Context) -> str:
    """Who asks, as recorded in manifests and control requests."""
    return f"airflow:{context['ti'].dag_id}/{context['ti'].task_id}"


def task_request_id(context: Context) -> str:
    """The same on every try of one task instance: a retry takes over what a dead try already made."""
    ti = context["ti"]
    run_id = getattr(ti, "run_id", None) or context.get("run_id") or "manual"
    return f"airflow:{ti.dag_id}/{run_id}/{ti.task_id}/{getattr(ti, 'map_index', -1)}"


def lease_holder(context: Context) -> str:
    """Who holds a job's lease: the DAG run, so that its tasks (and a task's retry) continue one operation
    while every other run, DAG or person is refused."""
    ti = context["ti"]
    return airflow_holder(ti.dag_id, str(getattr(ti, "run_id", None) or context.get("run_id") or "manual"))


class SavepointsBaseOperator(SavepointsMixin, BaseOperator):
    """Calls `run(job context, Airflow context)`; its return value is the task's XCom."""

    template_fields: Sequence[str] = ("job",)
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        job: str,
        aws_conn_id: str | None = SavepointsHook.default_conn_name,
        spark_conn_id: str | None = DEFAULT_SPARK_CONN,
        jobs_file: str | None = None,
        keep_lease: bool = False,
        lease_ttl: float = DEFAULT_TTL,
        kafka_conn_id: str | None = DEFAULT_KAFKA_CONN,
        **kwargs: Any,
    ) -> None:
        """`keep_lease`: the job's lease outlives the task (held by the DAG run, `lease_ttl` seconds), for the
        next step of an operation of several tasks; a ReleaseLeaseOperator ends it."""
        super().__init__(**kwargs)
        self._savepoints_args(job, aws_conn_id, spark_conn_id, jobs_file, kafka_conn_id)
        self.keep_lease = keep_lease
        self.lease_ttl = lease_ttl

    def execute(self, context: Context) -> Any:
        with task_errors(context, self.job):
            return self.run(self.job_context(context), context)

    @abstractmethod
    def run(self, ctx: JobContext, context: Context) -> Any:
        """The operator's one engine call; its return value is the task's XCom."""


def flag(value: object) -> bool:
    """A templated boolean: a real bool (native rendering) or its rendered text ("True", "false", ...);
    `bool("False")` would be True."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1", "yes")


def optional_int(value: object, what: str) -> int | None:
    """A templated whole number that may be unset ("", "None" once rendered)."""
    if value in (None, "", "None"):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise InvalidInput(f"invalid {what} {value!r}: give a whole number") from None


E = TypeVar("E", bound=StrEnum)


def choice(kind: type[E], value: object, what: str) -> E:
    """A templated enum value, or bad input that lists the valid ones."""
    try:
        return kind(str(value))
    except ValueError:
        raise InvalidInput(f"invalid {what} {value!r}: use one of {', '.join(k.value for k in kind)}") from None
