"""The fence of a job: which deployments may commit its output now. One record per job, `jobs/<job>/writers.json`
(layout.py), changed only by a conditional write (core/jobs/fence.py), read by every driver of the job on each
heartbeat (spark_jobs/runtime/fence.py): a driver whose deployment it does not name commits nothing more.

    {"job", "generation": the number of changes so far, "writers": {deployment id: the generation that admitted
     it}, "intervals": {deployment id: its driver's fence interval in seconds, as it was launched with},
     "changed_at", "by", "why", "fenced": {deployment id: when it was left out}}

Usually one writer; two during a blue/green, replay or migration upgrade (the old version and the new one, whose
gate keeps their windows apart). A job without the record has never been fenced: its drivers commit."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .. import layout
from ..errors import IntegrityError
from ..storage import Storage

FENCED_KEPT = 20  # the newest deployments left out, for a person reading the record


@dataclass(frozen=True)
class Writers:
    job: str
    generation: int = 0
    writers: dict[str, int] = field(default_factory=dict)
    intervals: dict[str, float] = field(default_factory=dict)
    changed_at: str = ""
    by: str = ""
    why: str = ""
    fenced: dict[str, str] = field(default_factory=dict)

    def admits(self, deployment_id: str) -> bool:
        return deployment_id in self.writers

    def changed(
        self, writers: dict[str, int], intervals: dict[str, float], left_out: list[str], *, at: str, by: str, why: str
    ) -> Writers:
        fenced = {**self.fenced, **dict.fromkeys(left_out, at)}
        newest = sorted(fenced.items(), key=lambda item: item[1])[-FENCED_KEPT:]
        kept = {d: s for d, s in {**self.intervals, **intervals}.items() if d in writers}
        return Writers(self.job, self.generation + 1, writers, kept, at, by, why, dict(newest))

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Writers:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError) as exc:
            raise IntegrityError(f"{where} is not a writers record ({exc}): see docs/guarantees.md") from None


def read_writers(storage: Storage, job: str) -> tuple[Writers, str | None]:
    """The job's fence record and its storage token (None: no record yet, an empty one returned)."""
    key = layout.writers_key(job)
    try:
        data, token = storage.read_with_token(key)
    except FileNotFoundError:
        return Writers(job), None
    return Writers.from_json(data, f"{storage.uri}/{key}"), token
