"""One of several processes that change the snapshots of one job at once (tests/core/test_catalog_processes.py):
creates, pins and unpins, deletes, and prunes under the job's lease, chosen at random; what each did (or why
it did not) goes to a JSON file for the test to compare with what the store holds afterwards."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from airflow_plugin.core.jobs.operation import operation


def work(store_uri: str, job: str, checkpoint: str, seed: int, rounds: int, out: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    from airflow_plugin.core.errors import SavepointsError, StoreUnavailable
    from airflow_plugin.core.jobs.context import JobContext
    from airflow_plugin.core.jobs.spec import JobSpec
    from airflow_plugin.core.retention.policy import KindPolicy, RetentionPolicy
    from airflow_plugin.core.retention.prune import execute, prune
    from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
    from airflow_plugin.core.snapshots.lifecycle import delete_snapshot, set_pinned
    from airflow_plugin.core.snapshots.store import SnapshotStore
    from airflow_plugin.core.storage import open_storage

    rng = random.Random(seed)
    store = SnapshotStore(open_storage(store_uri))
    context = JobContext(JobSpec.undeclared(job), store)
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=3), blob_grace_s=0.0)
    done: list[dict[str, Any]] = []
    for _ in range(rounds):
        op = rng.choice(["create", "create", "pin", "delete", "prune"])
        target: str | None = None
        planned: list[str] = []  # what a prune set out to delete: uncertain if it failed on the way
        try:
            if op == "create":
                made = create_snapshot(store, open_storage(checkpoint), SnapshotRequest(job=job), concurrency=2)
                done.append({"op": op, "ids": [made.id]})
            else:
                listed = store.list(job)
                target = rng.choice(listed).id if listed else None
                if op == "pin" and target:
                    set_pinned(store, job, target, rng.random() < 0.5)
                    done.append({"op": op, "ids": [target]})
                elif op == "delete" and target:
                    delete_snapshot(store, job, target, force=True)
                    done.append({"op": op, "ids": [target]})
                elif op == "prune":
                    with operation(context, "prune"):
                        plan, _ = prune(store, policy, job=job, dry_run=True)
                        planned = [a.target for a in plan.snapshots]
                        left = set(execute(store, plan, policy).left_alone)
                    done.append({"op": op, "ids": [i for i in planned if i not in left]})
        except StoreUnavailable as exc:  # under faults: whether it took effect is not known
            uncertain = [target] if op in ("pin", "delete") and target else planned
            done.append({"op": op, "uncertain": uncertain, "error": str(exc)})
        except SavepointsError as exc:  # refused (a busy lease, a pinned or vanished snapshot): nothing done
            done.append({"op": op, "refused": type(exc).__name__, "error": str(exc)})
    Path(out).write_text(json.dumps(done))
    os._exit(0)
