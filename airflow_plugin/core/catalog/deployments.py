"""A job's deployment index: its deployment records in one object beside them (layout.py
`deployment_index_key`), kept true to them by core/catalog/index.py. An entry holds the record, and once the
deployment is retired and its driver ended, its final heartbeat (which then changes no more): listing a
job's deployments and their end states is one read."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from .. import layout
from ..errors import IntegrityError
from ..records.deployment import Deployment, DeploymentStatus, final_status
from ..storage import ObjectInfo, Storage
from .index import RecordIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeploymentEntry:
    """A deployment as its job's index lists it: the record, and the heartbeat it ended with once retired
    (a retired deployment's driver has ended: that heartbeat is final)."""

    record: Deployment
    final: DeploymentStatus | None
    version: str | None


class DeploymentRecords:
    """A job's deployment records, as core/catalog/index.py sees them."""

    what = "deployment"

    def __init__(self, storage: Storage, job: str) -> None:
        self.storage, self.job = storage, job

    def key(self, record_id: str) -> str:
        return layout.deployment_key(self.job, record_id)

    def listing(self) -> dict[str, ObjectInfo]:
        listing = self.storage.list(layout.deployments_prefix(self.job))
        return {d: info for info in listing if (d := layout.deployment_id_of(info.key, self.job))}

    def entry(self, record_id: str, raw: bytes, version: str) -> DeploymentEntry | None:
        try:
            record = Deployment.from_json(raw, f"{self.storage.uri}/{self.key(record_id)}")
        except IntegrityError as exc:
            log.warning("skipping %s", exc)
            return None
        return DeploymentEntry(record, final_status(self.storage, record), version)

    def dump(self, entry: DeploymentEntry) -> dict[str, Any]:
        return {"record": asdict(entry.record), "final": asdict(entry.final) if entry.final else None}

    def load(self, data: dict[str, Any], version: str) -> DeploymentEntry:
        final = DeploymentStatus.from_dict(data["final"]) if data.get("final") else None
        return DeploymentEntry(Deployment(**data["record"]), final, version)


def deployment_index(storage: Storage, job: str) -> RecordIndex[DeploymentEntry]:
    return RecordIndex(storage, layout.deployment_index_key(job), DeploymentRecords(storage, job))
