"""The catalogs of a store: rebuild them from the manifests and deployment records, or check them."""

from __future__ import annotations

import argparse
from typing import Any

from ...core.catalog.rebuild import CatalogReport, check_catalogs, rebuild_catalogs
from ...core.jobs.context import Context
from ..options import add_job
from ..render import Output, say


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    catalog = commands.add_parser(
        "catalog",
        parents=[common],
        help="each job's snapshot catalog and deployment index: rebuild them, or check them against the records",
    )
    catalog.add_argument(
        "action",
        choices=["rebuild", "check"],
        help="rebuild: from every manifest and deployment record (reads them all); check: compare with a listing "
        "of them and settle what differs",
    )
    add_job(catalog, "only this job (default: every job of the store)", optional=True, was_option=True)
    catalog.set_defaults(run=run_catalog)


def run_catalog(args: argparse.Namespace, ctx: Context) -> Output:
    store = ctx.store(args.job)
    jobs = [args.job] if args.job else store.jobs()
    act = rebuild_catalogs if args.action == "rebuild" else check_catalogs
    reports = act(store.storage, jobs)

    def human() -> None:
        for report in reports:
            say(_line(report, args.action))
        if not reports:
            say(f"no jobs in {store.uri}")

    return Output({"store": store.uri, "jobs": [r.to_dict() for r in reports]}, human)


def _line(report: CatalogReport, action: str) -> str:
    listed = f"job {report.job}: {report.snapshots} snapshots, {report.deployments} deployments"
    if action == "rebuild":
        return f"{listed}: rebuilt in {report.seconds:.1f}s"
    if not report.differed:
        return f"{listed}: consistent"
    found = ", ".join(
        f"{len(ids)} {kind} ({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''})"
        for kind, ids in report.differed.items()
    )
    return f"{listed}: differed from the records in {found}: settled from them"
