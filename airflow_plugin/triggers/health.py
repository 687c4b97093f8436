"""DeploymentHealthTrigger: waits in the triggerer until a deployment is healthy (fresh heartbeat, K new
batches committed), cannot become healthy (failed, stopped, lost), or the deadline passes."""

from __future__ import annotations

from typing import Any, ClassVar

from ..core.jobs.health import Verdict
from ..hooks.savepoints import SavepointsHook
from .base import SavepointsPollTrigger


class DeploymentHealthTrigger(SavepointsPollTrigger):
    fields: ClassVar[tuple[str, ...]] = ("deployment_id", "min_batches", "lag_must_fall")

    def __init__(self, *, deployment_id: str, min_batches: int, lag_must_fall: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deployment_id = deployment_id
        self.min_batches = min_batches
        self.lag_must_fall = lag_must_fall

    def check(self, hook: SavepointsHook) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        health = hook.health(self.job, self.deployment_id, self.min_batches, self.lag_must_fall)
        seen = {"message": health.reason, "health": health.to_dict()}
        if health.verdict is Verdict.WAITING:
            return None, seen
        return {**seen, "status": "healthy" if health.verdict is Verdict.HEALTHY else "unhealthy"}, seen
