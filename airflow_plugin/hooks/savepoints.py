"""SavepointsHook: the one place the Airflow layer meets the engine's configuration. It turns Airflow's
connections into the engine's `Settings` and resolves a `Context` from them (core/context.py):

- the jobs file (the same one the CLI reads: `jobs_file`, else $SAVEPOINTS_JOBS, else ./jobs.toml);
- the store's S3 access from an Airflow AWS connection (login = access key id, password = secret access
  key, extras `endpoint_url` and `region_name`); without that connection, boto3's own chain
  (environment, profile, instance role) as the CLI uses it;
- spark-submit from a Spark connection (`spark_default`: host = master, extra `deploy-mode`); without that
  connection, the master and deploy mode of the jobs file.

Secrets never leave S3Settings (its repr hides them) and the environment of the drivers it launches.
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from ..compat import AirflowNotFoundException
from ..core.context import Context, JobContext, Settings
from ..core.jobs.health import Health, check_health
from ..core.jobs.launcher import CommandBuilder, default_command
from ..core.progress import NullProgress, Progress
from ..core.storage import S3Settings

log = logging.getLogger(__name__)
_NO_AWS_CONNECTION = "S3 access from boto3's own chain (environment, profile, role)"


class SavepointsHook(BaseHook):
    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "Savepoints store (S3)"

    def __init__(
        self,
        aws_conn_id: str | None = default_conn_name,
        spark_conn_id: str | None = "spark_default",
        jobs_file: str | None = None,
    ) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id
        self.spark_conn_id = spark_conn_id
        self.jobs_file = jobs_file

    def _connection(self, conn_id: str | None, what: str) -> Any | None:
        if not conn_id:
            return None
        try:
            return self.get_connection(conn_id)
        except AirflowNotFoundException:
            log.info("no Airflow connection %r: %s", conn_id, what)
            return None

    @cached_property
    def s3_settings(self) -> S3Settings | None:
        return self.settings_from(self._connection(self.aws_conn_id, _NO_AWS_CONNECTION))

    async def async_s3_settings(self) -> S3Settings | None:
        """The same for triggers, which run in the triggerer's event loop."""
        if not self.aws_conn_id:
            return None
        try:
            return self.settings_from(await self.aget_connection(self.aws_conn_id))
        except AirflowNotFoundException:
            log.info("no Airflow connection %r: %s", self.aws_conn_id, _NO_AWS_CONNECTION)
            return None

    @staticmethod
    def settings_from(conn: Any | None) -> S3Settings | None:
        if conn is None:
            return None
        extra = conn.extra_dejson
        return S3Settings(
            endpoint_url=extra.get("endpoint_url") or conn.host or None,
            region_name=extra.get("region_name") or None,
            access_key_id=conn.login or extra.get("aws_access_key_id") or None,
            secret_access_key=conn.password or extra.get("aws_secret_access_key") or None,
            session_token=extra.get("aws_session_token") or None,
        )

    @cached_property
    def command_builder(self) -> CommandBuilder:
        if self._connection(self.spark_conn_id, "spark-submit with the jobs file's master and deploy mode") is None:
            return default_command
        from .spark_submit import connection_command_builder  # only when a connection asks for it

        assert self.spark_conn_id is not None
        return connection_command_builder(self.spark_conn_id)

    def settings(self, *, requested_by: str = "", progress: Progress | None = None) -> Settings:
        # spark-submit is built only for tasks that launch something (resolving it reads a connection)
        return Settings(
            jobs_file=self.jobs_file,
            s3=self.s3_settings,
            command_builder=self.command_builder if self.spark_conn_id else default_command,
            progress=progress or NullProgress(),
            requested_by=requested_by,
        )

    @cached_property
    def context(self) -> Context:
        """The jobs file and store, resolved once for this hook."""
        return self.settings().resolve()

    def job_context(self, name: str, *, requested_by: str = "", progress: Progress | None = None) -> JobContext:
        """Everything one task needs to act on job `name`."""
        return self.settings(requested_by=requested_by, progress=progress).resolve().job(name)

    def health(self, job_name: str, deployment_id: str, min_batches: int) -> Health:
        """The health verdict of one deployment (the sensor's poke, the trigger's poll; blocking I/O)."""
        return check_health(self.job_context(job_name), deployment_id, min_batches=min_batches)
