"""What the reconcile loop keeps of a job, in the store (`jobs/<job>/reconcile.json`): its restart attempts (when,
why, from which batch, what came of each), the last version that ran healthy, the versions that failed for a given
jobs file (not tried again until the file changes or a person asks), a person's pause (the loop leaves the job
alone), and the autoscaler's: its rescales, its last recommendation, a scale-up it holds. Written whole; the
job's lease makes one writer at a time (apply.py writes it only while it holds the lease)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .. import layout
from ..autoscale.decide import Rescale
from ..errors import IntegrityError
from ..jobs.spec import RestartPolicy
from ..storage import Storage


@dataclass
class Restart:
    """One attempt to restart a failed deployment, recorded before anything is done. Its outcome: `deployment`
    (started), `error` (its kill or deploy failed: the failed deployment stays the newest), or neither (pending:
    the loop was killed in between; the next run goes on with it, and it counts once)."""

    at: float  # epoch seconds
    failed: str  # the deployment that failed or was lost
    why: str  # its state and error
    from_batch: int | None  # the batch its latest state resumes after
    deployment: str | None = None  # the one started in its place
    error: str | None = None  # why the attempt failed ("NoState: ..."): it counts against the budget all the same

    @property
    def pending(self) -> bool:
        return self.deployment is None and self.error is None


@dataclass
class Reconciled:
    job: str
    restarts: list[Restart] = field(default_factory=list)
    last_stable_version: str | None = None
    # version -> the jobs file's fingerprint it failed under: not tried again while the file is the same
    failed_versions: dict[str, str] = field(default_factory=dict)
    paused_by: str | None = None  # a person took over: the loop leaves the job alone
    budget_from: float | None = None  # `apply --retry`: the restart budget counts the restarts after this
    paused_at: str | None = None
    last_step: str | None = None  # what the last `apply` did, for status and the page
    rescales: list[Rescale] = field(default_factory=list)  # the autoscaler's, newest last
    recommendation: dict[str, Any] | None = None  # the autoscaler's last (decide.py Recommendation, and `at`)
    scale_up_held: str | None = None  # why scale-ups are held (an ineffective one)
    scale_up_held_under: str | None = None  # the jobs file's fingerprint it was held under: a change releases it
    rescales_total: int = 0  # every rescale the autoscaler began (`rescales` keeps the newest only)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Reconciled:
        try:
            data = json.loads(raw)
            known = {f.name for f in fields(cls)}
            record = cls(**{k: v for k, v in data.items() if k in known})
            attempt = {f.name for f in fields(Restart)}
            record.restarts = [
                Restart(**{k: v for k, v in r.items() if k in attempt}) for r in data.get("restarts", [])
            ]
            rescale = {f.name for f in fields(Rescale)}
            record.rescales = [
                Rescale(**{k: v for k, v in r.items() if k in rescale}) for r in data.get("rescales", [])
            ]
        except (ValueError, TypeError) as exc:
            raise IntegrityError(
                f"{where} is corrupt ({exc}): delete it; the loop starts over with no restart"
            ) from None
        return record

    def counted(self, policy: RestartPolicy, now: float) -> list[Restart]:
        """The restarts the budget counts at `now`: those in the policy's window, and after an `apply --retry`."""
        since = max(now - policy.window, self.budget_from or 0)
        return [r for r in self.restarts if r.at >= since]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read(storage: Storage, job: str) -> Reconciled:
    key = layout.reconcile_key(job)
    try:
        return Reconciled.from_json(storage.read(key), f"{storage.uri}/{key}")
    except FileNotFoundError:
        return Reconciled(job)


def write(storage: Storage, record: Reconciled) -> None:
    storage.write(layout.reconcile_key(record.job), record.to_json())
