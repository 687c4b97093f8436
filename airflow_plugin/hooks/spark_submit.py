"""spark-submit commands built by the Spark provider's SparkSubmitHook from a `spark_default`-style
connection (host = master, extras `deploy-mode`, `spark-binary`, `queue`, `namespace`), for the engine's
detached launcher. The hook only builds the command: its own tracking polls until the application ends,
which a streaming job never does."""

from __future__ import annotations

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from ..core.jobs.launcher import DETACH_CONF, CommandBuilder, SubmitSpec


def hook_command_builder(conn_id: str = "spark_default") -> CommandBuilder:
    """A CommandBuilder for `core.jobs.launcher.launch` that takes master and deploy mode from the connection."""

    def build(spec: SubmitSpec) -> list[str]:
        hook = SparkSubmitHook(
            conn_id=conn_id, conf=dict(spec.conf), name=spec.name, application_args=list(spec.app_args)
        )
        connection = hook._connection  # resolved from the connection when the hook was built
        manager = "local" if connection["master"].startswith("local") else connection["master"].split(":", 1)[0]
        if connection.get("deploy_mode") == "cluster" and manager in DETACH_CONF:
            hook._conf.update(DETACH_CONF[manager])  # the cluster's own detach switch
        # The provider keeps its command builder private; wrapping it keeps its connection handling.
        return hook._build_spark_submit_command(spec.application)

    return build
