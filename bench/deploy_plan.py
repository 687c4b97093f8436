"""The planning `savepoints deploy JOB --restore latest-savepoint` does before it writes anything but its
lease, in a process of its own (history_bench.py measures it): under the job's lease, the deployments that
may still run (there must be none), the newest COMPLETED savepoint, the new location's check, and the
restore plan (its Kafka positions checked when it has any). The engine calls of core/jobs/deploy.py
`_deploy`, in its order, through their public names.

    python -m bench.deploy_plan --jobs FILE --job JOB
"""

from __future__ import annotations

import argparse
import json

from airflow_plugin.core.context import Settings
from airflow_plugin.core.jobs.deploy import live_deployments
from airflow_plugin.core.jobs.deployments import new_deployment_id
from airflow_plugin.core.snapshots.manifest import Kind
from airflow_plugin.core.snapshots.restore import plan_restore


def plan(jobs: str, job: str) -> dict[str, object]:
    ctx = Settings(jobs_file=jobs).resolve().job(job)
    with ctx.operation("deploy"):
        live = live_deployments(ctx)
        if live:
            raise SystemExit(f"job {job} has a live deployment ({live[0][0].id}): the planning would refuse")
        source = ctx.store.latest(ctx.name, kind=Kind.SAVEPOINT)
        checkpoint = ctx.checkpoint_location(new_deployment_id())
        owners = [d.id for d in ctx.deployments.list(ctx.name) if d.checkpoint.rstrip("/") == checkpoint]
        if owners or ctx.open(checkpoint).exists():
            raise SystemExit(f"{checkpoint} is taken")
        target = ctx.open(checkpoint)
        restore = plan_restore(ctx.store, ctx.name, source.id, target, open_location=ctx.open, kafka=ctx.kafka)
    return {"snapshot": source.id, "batch_id": source.batch_id, "files": len(restore.files)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", required=True)
    parser.add_argument("--job", required=True)
    args = parser.parse_args()
    print(json.dumps(plan(args.jobs, args.job)))


if __name__ == "__main__":
    main()
