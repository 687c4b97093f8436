"""spark-submit commands for the engine's detached launcher, from a Spark connection in the form the Spark
provider defines (`spark_default`: the master in host (and port), extras `deploy-mode`, `queue`,
`namespace`, `spark-binary`).

Why this module reads the connection itself instead of calling the provider's SparkSubmitHook: the hook's
only public way to run spark-submit (`submit`) waits until the application ends, which a streaming job
never does, and its command builder is private. What we need from it is small: where the master is and
the deploy mode; the command itself is the engine's (core/jobs/launcher.py), so local, client and
cluster modes are launched, detached and recorded the same way with or without Airflow.

Read like the provider reads it: a connection of type `spark` made in the UI may hold the whole master URL
in its host (`k8s://https://host:443`, `local[2]`, `yarn`); otherwise the master is `<conn_type>://<host>`
with the port appended when set. Kerberos principal and keytab extras are not supported (say so: a job
needing them should set spark.kerberos.* in the jobs file's conf)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from typing import Any

from airflow.sdk import BaseHook

from ..core.errors import InvalidInput
from ..core.jobs.launcher import CommandBuilder, SubmitSpec, default_command

ALLOWED_BINARIES = ("spark-submit", "spark2-submit", "spark3-submit")  # the provider's own list


@dataclass(frozen=True)
class SparkTarget:
    """Where and how applications are submitted, from one connection."""

    master: str
    deploy_mode: str | None = None
    queue: str | None = None
    namespace: str | None = None
    binary: str | None = None

    @classmethod
    def from_connection(cls, conn: Any) -> SparkTarget:
        host = conn.host or ""
        if conn.conn_type == "spark" and host and ("://" in host or not conn.port):
            master = host
        else:
            master = f"{conn.conn_type}://{host}"
        if conn.port:
            master = f"{master}:{conn.port}"
        extra = conn.extra_dejson
        binary = extra.get("spark-binary")
        if binary is not None and binary not in ALLOWED_BINARIES:
            raise InvalidInput(
                f"connection {conn.conn_id}: spark-binary {binary!r} is not one of {', '.join(ALLOWED_BINARIES)}"
            )
        return cls(master, extra.get("deploy-mode"), extra.get("queue"), extra.get("namespace"), binary)

    def apply(self, spec: SubmitSpec) -> SubmitSpec:
        conf = dict(spec.conf)
        if self.queue:
            conf["spark.yarn.queue"] = self.queue
        if self.namespace:
            conf["spark.kubernetes.namespace"] = self.namespace
        return replace(spec, master=self.master, deploy_mode=self.deploy_mode or spec.deploy_mode, conf=conf)


def connection_command_builder(conn_id: str = "spark_default") -> CommandBuilder:
    """A CommandBuilder for `core.jobs.launcher.launch` that takes master and deploy mode from the connection."""
    target = SparkTarget.from_connection(BaseHook.get_connection(conn_id))

    def build(spec: SubmitSpec) -> list[str]:
        command = default_command(target.apply(spec))
        if target.binary:
            command[0] = shutil.which(target.binary) or target.binary
        return command

    return build
