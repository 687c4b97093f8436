"""SavepointsHook: the one place the Airflow layer meets the engine's configuration. It turns Airflow's
connections into the engine's `Settings` and resolves a `Context` from them (core/jobs/context.py):

- the jobs file (the same one the CLI reads: `jobs_file`, else $SAVEPOINTS_JOBS, else ./jobs.toml);
- the store's S3 access from an Airflow AWS connection, read as the Amazon provider reads it for every other
  AWS operator (its AwsConnectionWrapper and session factory: keys, `role_arn` assumed and refreshed, profiles,
  web identity, `endpoint_url`, `region_name`, `service_config`); without that connection, boto3's own chain
  (environment, profile, instance role) as the CLI uses it. What reaches a deployment's driver, which runs for
  weeks: the connection's keys when they do not expire; nothing (its machine's own identity) when the
  connection's extra says `"driver_credentials": "own"`; credentials that expire are refused (storage/s3.py);
- spark-submit from a Spark connection (`spark_default`: host = master, extra `deploy-mode`); without that
  connection, the master and deploy mode of the jobs file;
- the Kafka broker whose offsets every restore checks from a Kafka connection as the Airflow Kafka provider
  defines it (`kafka_default`: extra = the client config, with `bootstrap.servers`); without it,
  $SAVEPOINTS_KAFKA_BOOTSTRAP, else the job's `kafka` table in the jobs file.

Secrets never leave S3Settings (its repr hides them) and the environment of the drivers it launches.
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from ..compat import AirflowNotFoundException
from ..core.jobs.context import Context, JobContext, Settings
from ..core.jobs.health import Health, check_health
from ..core.jobs.launcher import CommandBuilder, default_command
from ..core.lease import DEFAULT_TTL
from ..core.progress import NullProgress, Progress
from ..core.sources.kafka import KafkaSettings
from ..core.storage import S3Settings

log = logging.getLogger(__name__)
_NO_AWS_CONNECTION = "S3 access from boto3's own chain (environment, profile, role)"
_NO_KAFKA_CONNECTION = "the Kafka broker from $SAVEPOINTS_KAFKA_BOOTSTRAP or the jobs file"
DEFAULT_KAFKA_CONN = "kafka_default"
_CONSUMER_ONLY = ("group.id", "auto.offset.reset", "enable.auto.commit")  # the provider's consumers' settings


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
        kafka_conn_id: str | None = DEFAULT_KAFKA_CONN,
    ) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id
        self.spark_conn_id = spark_conn_id
        self.jobs_file = jobs_file
        self.kafka_conn_id = kafka_conn_id

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
        """An AWS connection as the Amazon provider reads it. Keys that do not expire are the settings' own (a driver
        may have them); anything else (a role to assume, web identity, a profile, a session token) is the provider's
        session, whose credentials it refreshes."""
        if conn is None:
            return None
        from airflow.providers.amazon.aws.hooks.base_aws import BaseSessionFactory
        from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper

        wrapper = AwsConnectionWrapper(conn=conn)
        where = {"endpoint_url": wrapper.get_service_endpoint_url("s3") or conn.host or None}
        where["region_name"] = wrapper.region_name
        keys = wrapper.aws_access_key_id and wrapper.aws_secret_access_key
        if keys and not wrapper.role_arn and not wrapper.aws_session_token and not wrapper.profile_name:
            return S3Settings(
                **where, access_key_id=wrapper.aws_access_key_id, secret_access_key=wrapper.aws_secret_access_key
            )
        own = str(wrapper.extra_config.get("driver_credentials", "")).lower() == "own"
        temporary = bool(wrapper.role_arn or wrapper.aws_session_token)
        session = BaseSessionFactory(conn=wrapper).create_session()
        return S3Settings(**where, session=session, temporary=temporary, drivers_own_identity=own)

    @cached_property
    def kafka_settings(self) -> KafkaSettings | None:
        return self.kafka_from(self._connection(self.kafka_conn_id, _NO_KAFKA_CONNECTION))

    @staticmethod
    def kafka_from(conn: Any | None) -> KafkaSettings | None:
        """A Kafka connection as the Kafka provider keeps it: its extra is the client config."""
        if conn is None:
            return None
        extra = {str(k): str(v) for k, v in conn.extra_dejson.items()}
        address = extra.pop("bootstrap.servers", "") or (f"{conn.host}:{conn.port}" if conn.host and conn.port else "")
        if not address:
            log.warning("Airflow connection %r has no bootstrap.servers: %s", conn.conn_id, _NO_KAFKA_CONNECTION)
            return None
        return KafkaSettings(address, {k: v for k, v in extra.items() if k not in _CONSUMER_ONLY})

    @cached_property
    def command_builder(self) -> CommandBuilder:
        if self._connection(self.spark_conn_id, "spark-submit with the jobs file's master and deploy mode") is None:
            return default_command
        from .spark_submit import connection_command_builder  # only when a connection asks for it

        assert self.spark_conn_id is not None
        return connection_command_builder(self.spark_conn_id)

    def settings(
        self,
        *,
        requested_by: str = "",
        request_id: str | None = None,
        progress: Progress | None = None,
        holder: str | None = None,
        keep_lease: bool = False,
        lease_ttl: float = DEFAULT_TTL,
    ) -> Settings:
        # spark-submit is built only for tasks that launch something (resolving it reads a connection)
        return Settings(
            jobs_file=self.jobs_file,
            s3=self.s3_settings,
            kafka=self.kafka_settings,
            command_builder=self.command_builder if self.spark_conn_id else default_command,
            progress=progress or NullProgress(),
            requested_by=requested_by,
            request_id=request_id,
            holder=holder,
            keep_lease=keep_lease,
            lease_ttl=lease_ttl,
        )

    @cached_property
    def context(self) -> Context:
        """The jobs file and store, resolved once for this hook."""
        return self.settings().resolve()

    def job_context(self, name: str, **settings: Any) -> JobContext:
        """Everything one task needs to act on job `name` (`settings`: those of `settings()`)."""
        return self.settings(**settings).resolve().job(name)

    def health(self, job_name: str, deployment_id: str, min_batches: int, lag_must_fall: bool = False) -> Health:
        """The health verdict of one deployment (the sensor's poke, the trigger's poll; blocking I/O)."""
        return check_health(
            self.job_context(job_name), deployment_id, min_batches=min_batches, lag_must_fall=lag_must_fall
        )
