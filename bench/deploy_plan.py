"""The planning `savepoints deploy JOB --restore latest-savepoint` does before it writes anything but its
lease, in a process of its own (history_bench.py measures it): under the job's lease, the deployments that
may still run (there must be none), the newest COMPLETED savepoint, the new location's check, and the
restore plan (its Kafka positions checked when it has any): core/jobs/deploy.py `plan_deploy`, on the
deployments the lease's operation found, as `deploy` runs it.

    python -m bench.deploy_plan --jobs FILE --job JOB
"""

from __future__ import annotations

import argparse
import json

from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, plan_deploy


def plan(jobs: str, job: str) -> dict[str, object]:
    ctx = Settings(jobs_file=jobs).resolve().job(job)
    with ctx.operation("deploy") as found:
        assert found is not None  # the outermost operation: what it found on taking the lease
        planned = plan_deploy(ctx, DeployRequest(restore="latest-savepoint"), found)
    assert planned.source is not None and planned.restore is not None
    return {"snapshot": planned.source.id, "batch_id": planned.source.batch_id, "files": len(planned.restore.files)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", required=True)
    parser.add_argument("--job", required=True)
    args = parser.parse_args()
    print(json.dumps(plan(args.jobs, args.job)))


if __name__ == "__main__":
    main()
