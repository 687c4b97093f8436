"""The catalogs of a store's jobs, as a whole: each job's snapshot catalog (snapshots.py) and deployment
index (deployments.py), rebuilt from the manifests and records (`savepoints catalog rebuild`:
every job's at once, instead of on first use) or checked against a
listing of them, every difference settled (`savepoints catalog check`)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..parallel import map_parallel
from ..storage import Storage
from .deployments import deployment_index
from .snapshots import snapshot_catalog


@dataclass(frozen=True)
class CatalogReport:
    """One job's catalogs after a rebuild or a check: what they list, and what differed from the records."""

    job: str
    snapshots: int
    deployments: int
    seconds: float
    differed: dict[str, list[str]] = field(default_factory=dict)  # "snapshots"/"deployments" -> ids settled

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rebuild_catalogs(storage: Storage, jobs: list[str]) -> list[CatalogReport]:
    """Rebuild the catalogs of `jobs` from their records; writers at work keep their marks."""

    def one(job: str) -> CatalogReport:
        started = time.monotonic()
        snapshots = snapshot_catalog(storage, job).rebuild()
        deployments = deployment_index(storage, job).rebuild()
        return CatalogReport(job, len(snapshots), len(deployments), round(time.monotonic() - started, 3))

    return map_parallel(one, jobs, concurrency=4)


def check_catalogs(storage: Storage, jobs: list[str]) -> list[CatalogReport]:
    """Compare the catalogs of `jobs` with listings of their records; settle differences."""

    def one(job: str) -> CatalogReport:
        started = time.monotonic()
        snapshots, wrong_snapshots = snapshot_catalog(storage, job).validate()
        deployments, wrong_deployments = deployment_index(storage, job).validate()
        differed = {"snapshots": wrong_snapshots, "deployments": wrong_deployments}
        seconds = round(time.monotonic() - started, 3)
        return CatalogReport(job, len(snapshots), len(deployments), seconds, {k: v for k, v in differed.items() if v})

    return map_parallel(one, jobs, concurrency=4)
