"""Looking at jobs from outside: `metrics` (OpenMetrics text for Prometheus), `inspect` (what a snapshot's state
holds) and `diff` (what changed in the state between two snapshots)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ...core import metrics
from ...core.errors import SparkToolFailed
from ...core.jobs.context import Context
from ...core.snapshots.inspect import diff_snapshots, inspect_snapshot
from ..options import add_concurrency_option, add_job
from ..render import Output, human_bytes, say


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    metrics_cmd = commands.add_parser(
        "metrics",
        parents=[common],
        help="every job's figures as OpenMetrics text for Prometheus (what the plugin serves at /savepoints/metrics)",
    )
    add_job(
        metrics_cmd,
        "only these jobs (default: the jobs file's jobs, else the store's)",
        many=True,
        was_option=True,
    )
    metrics_cmd.set_defaults(run=run_metrics)

    inspect = commands.add_parser(
        "inspect",
        parents=[common],
        help="what a snapshot's state holds, read by Spark from a scratch restore (never the live checkpoint)",
    )
    add_job(inspect, was_option=True)
    inspect.add_argument("id", metavar="ID", help="snapshot id, or 'latest'")
    inspect.add_argument(
        "--key", metavar="VALUE", help="the rows of this key (a value of any key field, or FIELD=VALUE)"
    )
    inspect.add_argument("--sample", type=int, default=5, help="rows shown per operator and store (default 5)")
    add_concurrency_option(inspect)
    inspect.set_defaults(run=run_inspect)

    diff = commands.add_parser(
        "diff", parents=[common], help="what changed in the state from snapshot A to snapshot B, per operator"
    )
    add_job(diff, was_option=True)
    diff.add_argument("a", metavar="A", help="the earlier snapshot id")
    diff.add_argument("b", metavar="B", help="the later snapshot id, or 'latest'")
    diff.add_argument("--top", type=int, default=10, help="keys that grew most, shown per store (default 10)")
    add_concurrency_option(diff)
    diff.set_defaults(run=run_diff)


def run_metrics(args: argparse.Namespace, ctx: Context) -> Output:
    figures = metrics.observe(ctx, args.job or None)
    text = metrics.render(figures).decode()
    data = {"jobs": [asdict(j) for j in figures.jobs], "stores": [asdict(s) for s in figures.stores]}
    return Output(data, lambda: sys.stdout.write(text))


def _read_state(
    args: argparse.Namespace, ctx: Context, read: Callable[..., dict[str, Any]], *ids: str, **options: Any
) -> dict[str, Any]:
    """`inspect` or `diff` of the job's snapshots, with the job's Spark settings."""
    job = ctx.snapshots_of(args.job)
    return read(job.store, args.job, *ids, spark_conf=job.spark_conf(), concurrency=ctx.settings.concurrency, **options)


def run_inspect(args: argparse.Namespace, ctx: Context) -> Output:
    report = _read_state(args, ctx, inspect_snapshot, args.id, key=args.key, sample=args.sample)

    def human() -> None:
        snapshot = report["snapshot"]
        say(f"snapshot {snapshot['id']} of job {args.job}, state at batch {snapshot['batch_id']}")
        if not report["operators"]:
            say("  no stateful operator: nothing to inspect")
        for op in report["operators"]:
            say(f"operator {op['operator']} ({op.get('name')}) store {op['store']}")
            say(f"  key:   {op.get('key_schema')}")
            say(f"  value: {op.get('value_schema')}")
            spread = op.get("skew") or {}
            largest = ", ".join(f"{p}: {n}" for p, n in spread.get("largest", []))
            say(
                f"  rows: {op.get('rows')} in {op.get('partitions')} partitions (largest {largest}; largest/mean "
                f"{spread.get('ratio')}); the operator's state files: {human_bytes(op.get('operator_bytes'))}"
            )
            if op.get("oldest_window_start"):
                say(f"  oldest window: starts {op['oldest_window_start']}, key {op['oldest_key']}")
            for row in op.get("sample", []):
                say(f"  sample [partition {row['partition_id']}] {row['key']} -> {row['value']}")
            if args.key is not None:
                matches = op.get("matches", [])
                say(f"  key {args.key!r}: {len(matches)} row(s)")
                for row in matches:
                    say(f"    [partition {row['partition_id']}] {row['key']} -> {row['value']}")
        for problem in report["problems"]:
            say(f"problem: {problem}")

    return Output(report, human, error=_unreadable(report))


def _unreadable(report: dict[str, Any]) -> SparkToolFailed | None:
    """Exit 8 once the report is shown, when Spark could not read some state."""
    problems = report["problems"]
    return SparkToolFailed(f"{len(problems)} state(s) could not be read: see above") if problems else None


def run_diff(args: argparse.Namespace, ctx: Context) -> Output:
    report = _read_state(args, ctx, diff_snapshots, args.a, args.b, top=args.top)

    def human() -> None:
        a, b = report["a"], report["b"]
        say(f"job {args.job}: snapshot {a['id']} (batch {a['batch_id']}) -> {b['id']} (batch {b['batch_id']})")
        for op in report["operators"]:
            say(f"operator {op['operator']} ({op.get('name')}) store {op['store']}")
            if op.get("only_in"):
                say(f"  only in snapshot {op['only_in'].upper()}")
                continue
            say(
                f"  keys: {op['added']} added, {op['removed']} removed, {op['changed']} changed; rows {op['rows_a']} "
                f"-> {op['rows_b']}; values {human_bytes(op['bytes_a'])} -> {human_bytes(op['bytes_b'])} as JSON "
                f"(+{human_bytes(op['bytes_added'])} added, -{human_bytes(op['bytes_removed'])} removed); the "
                f"operator's state files {human_bytes(op.get('operator_bytes_a'))} -> "
                f"{human_bytes(op.get('operator_bytes_b'))}"
            )
            if op.get("grew_most"):
                say(f"  grew most (by {op['growth_by']}):")
            for grown in op.get("grew_most", []):
                say(f"    {grown['key']}: +{grown['growth']:g} ({grown['before']} -> {grown['after']})")
        for problem in report["problems"]:
            say(f"problem: {problem}")

    return Output(report, human, error=_unreadable(report))
