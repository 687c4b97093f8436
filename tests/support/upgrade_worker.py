"""A process that drives one upgrade (tests/core/test_upgrades.py): it reads the upgrade's record once, then acts on
that copy of it, one command per line on stdin, and says what came of each on stdout, one JSON line: the phase, or
the error that refused it. The test kills it between two lines: a driver that died, or a task killed while it waits.

    python -m tests.support.upgrade_worker JOBS_FILE JOB UPGRADE_ID [HOLDER]

commands: `advance` (one step, steps.py `advance`), `ask SECONDS` (run.py `await_approval`), `approve BY`; HOLDER is
the driver (an Airflow DAG run's `airflow:<dag>/<run>`), else this process."""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _say(said: dict[str, Any]) -> None:
    print(json.dumps(said), flush=True)


def main(jobs: str, job: str, upgrade_id: str, holder: str | None = None) -> None:
    from airflow_plugin.core.errors import SavepointsError
    from airflow_plugin.core.jobs.context import Settings
    from airflow_plugin.core.upgrades.record import Upgrades
    from airflow_plugin.core.upgrades.run import approve, await_approval
    from airflow_plugin.core.upgrades.steps import advance

    ctx = Settings(jobs_file=jobs, holder=holder).resolve().job(job)
    upgrade = Upgrades(ctx.store.storage).get(job, upgrade_id)  # this process's copy from now on
    _say({"read": str(upgrade.phase), "pid": os.getpid()})
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        try:
            if command == "advance":
                upgrade = advance(ctx, upgrade)
            elif command == "ask":
                upgrade = await_approval(ctx, upgrade, float(argument))
            elif command == "approve":
                upgrade = approve(ctx, upgrade, argument)
            else:
                raise SystemExit(f"unknown command {command!r}")
            _say({"phase": str(upgrade.phase)})
        except SavepointsError as exc:
            _say({"refused": type(exc).__name__, "error": str(exc)})


if __name__ == "__main__":
    main(*sys.argv[1:])
