"""The driver's side of the fence (airflow_plugin/core/jobs/fence.py has the model): on each heartbeat, read the
job's writers record; while it names this deployment, the JVM's fence (`savepoints.fence.Fence`, in front of every
commit file Spark writes: FencedCheckpointFileManager) stays valid for the fence interval from the moment the read
began; once it does not, the fence is superseded for good and the driver stops (FAILED, FENCED).

Which clock: the renewal carries `time.monotonic_ns()` taken before the read, and the JVM adds the interval to it
on `System.nanoTime()`: both are CLOCK_MONOTONIC on Linux, so a driver paused between its read and the renewal
cannot stretch its validity, and a driver paused past the interval finds its fence lapsed when it wakes."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from airflow_plugin.core.jobs.fence import FENCED

__all__ = ["FENCED", "FENCE_REFUSAL", "DriverFence", "Fenced"]
from airflow_plugin.core.records.writers import read_writers
from airflow_plugin.core.storage import Storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

JVM_CLASS = "savepoints.fence.Fence"
FENCE_REFUSAL = "SAVEPOINTS_FENCED"  # how the JVM's fence begins the message of a commit it refused


class Fenced(Exception):
    """This deployment is no longer a writer of its job: it commits nothing more."""

    error_class = FENCED


class DriverFence:
    """The fence of one deployment's driver. Inert until `arm` (a standby arms when it starts its query)."""

    def __init__(self, storage: Storage, job: str, deployment_id: str, interval: float) -> None:
        self.storage = storage
        self.job = job
        self.deployment_id = deployment_id
        self.interval = interval
        self.superseded: str | None = None
        self._jvm: Any = None
        self._lock = threading.Lock()

    def arm(self, spark: SparkSession) -> None:
        """From now on every commit of this driver passes the fence: renewed at once, then on each heartbeat."""
        fence = spark._jvm
        for part in JVM_CLASS.split("."):
            fence = getattr(fence, part)
        if type(fence).__name__ != "JavaClass":  # py4j names an unknown class a JavaPackage
            raise Fenced(
                f"the fence's class {JVM_CLASS} is not on the driver's classpath: launch the driver through "
                "savepoints (it adds the fence's jar to spark.jars), or start it without --fence-interval"
            )
        fence.arm(float(self.interval))
        self._jvm = fence
        self.renew()
        if self.superseded is not None:
            raise Fenced(self.superseded)

    @property
    def armed(self) -> bool:
        return self._jvm is not None

    def renew(self) -> None:
        """Read the writers record: still named, the fence holds for another interval from this read's start;
        not named, it is superseded. A failed read renews nothing: the fence lapses by itself."""
        if self._jvm is None or self.superseded is not None:
            return
        with self._lock:
            started = time.monotonic_ns()
            try:
                record, _ = read_writers(self.storage, self.job)
            except Exception as exc:
                log.warning(
                    "could not read the writers record of job %s (the fence lapses unless renewed): %s", self.job, exc
                )
                return
            if record.generation == 0 or record.admits(self.deployment_id):
                self._jvm.renew(started, float(self.interval))
                return
            self.superseded = (
                f"deployment {self.deployment_id} was left out of job {self.job}'s writers at generation "
                f"{record.generation} ({record.why}, by {record.by or 'someone'}, {record.changed_at}): another "
                "driver writes the job's output now"
            )
            self._jvm.supersede(self.superseded)
            log.error("fenced: %s", self.superseded)

    def check(self, what: str) -> None:
        """Before a write the runtime makes itself (a gated Delta commit): raise unless this driver may write now
        (waits while its fence lapsed, as the JVM's own checks do)."""
        if self._jvm is None:
            return
        try:
            self._jvm.check(what)
        except Exception as exc:  # py4j's Py4JJavaError: the JVM's IOException
            raise Fenced(self.superseded or str(exc)) from None
