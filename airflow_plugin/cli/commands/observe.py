"""Looking at jobs from outside: `metrics` (OpenMetrics text for Prometheus)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from typing import Any

from ...core import metrics
from ...core.context import Context
from ..render import Output


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    metrics_cmd = commands.add_parser(
        "metrics",
        parents=[common],
        help="every job's figures as OpenMetrics text for Prometheus (what the plugin serves at /savepoints/metrics)",
    )
    metrics_cmd.add_argument(
        "--job", action="append", help="only this job (repeatable; default: the jobs file's jobs, else the store's)"
    )
    metrics_cmd.set_defaults(run=run_metrics)


def run_metrics(args: argparse.Namespace, ctx: Context) -> Output:
    figures = metrics.observe(ctx, args.job)
    text = metrics.render(figures).decode()
    data = {"jobs": [asdict(j) for j in figures.jobs], "stores": [asdict(s) for s in figures.stores]}
    return Output(data, lambda: sys.stdout.write(text))
