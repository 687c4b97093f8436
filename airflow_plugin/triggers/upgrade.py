"""UpgradeTrigger: waits in the triggerer while an upgrade's step waits for the world (green catching up, the old
version's watermark passing T, the health gate: core/upgrades/steps.py `waiting`, a look that acts on nothing), and
ends when advancing the upgrade would make progress, when someone else moved it on (its phase changed), or at the
deadline (the task then advances it once, which also renews the upgrade's lease, and defers again)."""

from __future__ import annotations

from typing import Any, ClassVar

from ..core.upgrades.record import Upgrades
from ..core.upgrades.steps import waiting
from ..hooks.savepoints import SavepointsHook
from .base import SavepointsPollTrigger


class UpgradeTrigger(SavepointsPollTrigger):
    fields: ClassVar[tuple[str, ...]] = ("upgrade_id", "phase")

    def __init__(self, *, upgrade_id: str, phase: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.upgrade_id = upgrade_id
        self.phase = phase

    def check(self, hook: SavepointsHook) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        ctx = hook.job_context(self.job)
        upgrade = Upgrades(ctx.store.storage).get(ctx.name, self.upgrade_id)
        seen: dict[str, Any] = {"upgrade": upgrade.id, "phase": str(upgrade.phase)}
        if str(upgrade.phase) != self.phase:
            return {**seen, "status": "moved", "message": f"the upgrade moved on to {upgrade.phase}"}, seen
        why = waiting(ctx, upgrade)
        if why is None:
            return {**seen, "status": "ready", "message": f"{upgrade.phase}: ready to go on"}, seen
        return None, {**seen, "message": why}
