"""A small jobs file for tests that need declared jobs but no Spark, and a stand-in job application."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_plugin.core.jobs.context import JobContext


def write_jobs(tmp_path: Path, application: str = "job.py", extra: str = "", *, touch: bool = True) -> Path:
    """Declares job `orders` (v1, v2) running `application`, which is created empty unless `touch` is off or
    it exists: deploys get as far as spark-submit."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if touch and not (tmp_path / application).exists():
        (tmp_path / application).touch()
    path = tmp_path / "jobs.toml"
    path.write_text(
        f"""
[defaults]
store = "store"
checkpoint_root = "checkpoints"
log_dir = "logs"

[jobs.orders]
trigger_interval = "1 second"
delivery = "exactly-once"
args = ["--input", "in", "--output", "out"]
conf = {{ "spark.sql.shuffle.partitions" = "3" }}
versions.v1 = {{ application = "{application}" }}
versions.v2 = {{ application = "{application}", args = ["--variant", "2"] }}
{extra}
"""
    )
    return path


# A job application for spark-submit that behaves like a managed job to the engine (a RUNNING heartbeat in
# the store) without a query, and never looks at its control channel: it stops only when killed.
STUBBORN_JOB = """
import argparse, time
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import State, DeploymentStatus
from airflow_plugin.core.storage import open_storage
from tests.support.jobs import write_jobs
p = argparse.ArgumentParser()
for name in ("--store", "--job", "--deployment", "--checkpoint", "--trigger-interval", "--delivery"):
    p.add_argument(name)
args, _ = p.parse_known_args()
deployments = Deployments(open_storage(args.store))
while True:  # a heartbeat, and never a look at the control channel
    deployments.write_status(args.job, args.deployment, DeploymentStatus(State.RUNNING, time.time(), last_batch_id=1))
    time.sleep(0.2)
"""


# A job application for spark-submit that, like the job runtime, writes a checkpoint, keeps a RUNNING
# heartbeat and honours a stop request through the runtime's own control channel, two seconds after it
# sees it (a stop at the next batch boundary), and then reports STOPPED with the request handled.
POLITE_JOB = """
import argparse, time
from pathlib import Path
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import State, DeploymentStatus
from airflow_plugin.core.storage import open_storage
from spark_jobs.runtime.control import ControlChannel
from tests.support.synthetic import write_checkpoint
p = argparse.ArgumentParser()
for name in ("--store", "--job", "--deployment", "--checkpoint", "--trigger-interval", "--delivery"):
    p.add_argument(name)
args, _ = p.parse_known_args()
write_checkpoint(Path(args.checkpoint), batches=20, partitions=4)
deployments = Deployments(open_storage(args.store))
control = ControlChannel(deployments, args.job, args.deployment)
while (request := control.next_stop()) is None:
    deployments.write_status(args.job, args.deployment, DeploymentStatus(State.RUNNING, time.time(), last_batch_id=19))
    time.sleep(0.2)
for _ in range(10):
    deployments.write_status(args.job, args.deployment, DeploymentStatus(State.STOPPING, time.time(), last_batch_id=19))
    time.sleep(0.2)
stopped = DeploymentStatus(State.STOPPED, time.time(), last_batch_id=19, handled_requests=[request.id])
deployments.write_status(args.job, args.deployment, stopped)
"""


def kill_every_deployment(job: JobContext) -> None:
    """A test's clean-up: every driver of the job killed, even under a lease a killed upgrade left (broken first)."""
    import contextlib

    from airflow_plugin.core.errors import NotFound, SavepointsError
    from airflow_plugin.core.jobs.stop import kill
    from airflow_plugin.core.lease import break_lease

    with contextlib.suppress(NotFound):  # the upgrade ended and released it: nothing to break
        break_lease(job.store.storage, job.name)
    for deployment in job.deployments.list(job.name):
        with contextlib.suppress(SavepointsError):
            kill(job, deployment.id)


# POLITE_JOB's behaviour, as a job the autoscaler sees falling behind and the upgrade steps can drive: its heartbeat
# carries a load of batches back to back at 10 rows a second (autoscale/load.py's buckets over the last five minutes,
# each busy all the time it covers); it commits a batch a second into its checkpoint (tests/support/synthetic.py),
# each only while the job's writers record names it (left out, it ends FAILED, FENCED, as the runtime's fence does);
# it starts in STANDBY with --standby until a start request (stop_restore's pre-start), STARTING before that while a
# file standby.hold lies beside it (a warm-up that takes long), and a --preflight run ends STOPPED at once.
BUSY_JOB = """
import argparse, time
from pathlib import Path
from airflow_plugin.core.autoscale.load import BUCKET_S
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import State, DeploymentStatus
from airflow_plugin.core.records.writers import read_writers
from airflow_plugin.core.storage import open_storage
from spark_jobs.runtime.control import ControlChannel
from tests.support.synthetic import add_batch, write_checkpoint
p = argparse.ArgumentParser()
for name in ("--store", "--job", "--deployment", "--checkpoint", "--trigger-interval", "--delivery", "--preflight"):
    p.add_argument(name)
p.add_argument("--standby", action="store_true")
args, _ = p.parse_known_args()
storage = open_storage(args.store)
deployments = Deployments(storage)
handled = []

def status(state, batch, **more):
    now = time.time()
    start = int(now // BUCKET_S * BUCKET_S)  # the current bucket, as full as the time it has run
    load = [{"t": t, "batches": 1, "rows": 10 * BUCKET_S, "busy_ms": BUCKET_S * 1000, "backlog": None}
            for t in range(start - 300, start, BUCKET_S)]
    load.append({"t": start, "batches": 1, "rows": int(10 * (now - start)), "busy_ms": int(1000 * (now - start)),
                 "backlog": None})
    deployments.write_status(args.job, args.deployment, DeploymentStatus(
        state, now, last_batch_id=batch, load=load, handled_requests=list(handled), **more))

if args.preflight:
    status(State.STOPPED, None)
    raise SystemExit(0)
control = ControlChannel(deployments, args.job, args.deployment)
if args.standby:
    hold = Path(__file__).with_name("standby.hold")  # a test's slow warm-up: STARTING while this file exists
    while hold.exists():
        if (request := control.next_request("stop")) is not None:
            handled.append(request.id)
            status(State.STOPPED, None)
            raise SystemExit(0)
        status(State.STARTING, None)
        time.sleep(0.2)
    status(State.STANDBY, None)
    while (request := control.next_request("start", "stop")) is None:
        time.sleep(0.1)
    handled.append(request.id)
    if request.action == "stop":
        status(State.STOPPED, None)
        raise SystemExit(0)
checkpoint = Path(args.checkpoint)
if not (checkpoint / "metadata").exists():
    write_checkpoint(checkpoint, batches=20, partitions=3)
batch = max(int(c.name) for c in (checkpoint / "commits").iterdir() if c.name.isdigit())
committed = time.monotonic()
while (request := control.next_stop()) is None:
    if time.monotonic() - committed >= 1:
        writers, token = read_writers(storage, args.job)
        if token is not None and not writers.admits(args.deployment):
            status(State.FAILED, batch, error_class="FENCED", error_message="left out of the writers record")
            raise SystemExit(1)
        batch += 1
        add_batch(checkpoint, batch, partitions=3)
        committed = time.monotonic()
    status(State.RUNNING, batch)
    time.sleep(0.2)
handled.append(request.id)
status(State.STOPPED, batch)
"""
