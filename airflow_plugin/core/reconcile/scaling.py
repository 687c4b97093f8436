"""The autoscaler's doings as people read them: the lines `savepoints status` prints of a job's autoscaler (from
`declared_status()["autoscale"]`, the same dict `status --json`, the page and the metrics read), and an upgrade's
title, which names a rescale as one ("rescale 2 -> 4") rather than as an upgrade of a version to itself."""

from __future__ import annotations

from typing import Any

from ..timestamps import utc_stamp
from ..upgrades.record import Upgrade


def rescale_sizes(upgrade: Upgrade) -> tuple[int | None, int] | None:
    """(from, to) of an upgrade that was a rescale, else None: a rescale records the size it goes to and the one
    it leaves (any other upgrade keeps the old deployment's size: upgrades/steps.py `sized`)."""
    if upgrade.size is None or upgrade.from_size == upgrade.size:
        return None
    return upgrade.from_size, upgrade.size


def upgrade_title(upgrade: Upgrade) -> str:
    """What an upgrade did, in a few words: `rescale 2 -> 4` (with the state's new partitions), else `upgrade to
    v2`."""
    sizes = rescale_sizes(upgrade)
    if sizes is None:
        return f"upgrade to {upgrade.to_version}"
    before, after = sizes
    partitions = f", state to {upgrade.partitions} partitions" if upgrade.partitions else ""
    return f"rescale {'?' if before is None else before} -> {after}{partitions}"


def describe_autoscale(job: str, autoscale: dict[str, Any]) -> list[str]:
    """The autoscaler of one job in a few lines: its mode and size within min..max, its last recommendation and
    why, its last rescale, and a held scale-up with the command that clears it."""
    size = autoscale.get("size")
    at = "not running" if size is None else f"at {size}"
    lines = [f"autoscale ({autoscale['mode']}): {at} {autoscale['knob']}, {autoscale['min']}..{autoscale['max']}"]
    recommendation = autoscale.get("recommendation")
    if recommendation:
        lines.append(f"recommended at {utc_stamp(recommendation['at'])}: {recommended(recommendation, autoscale)}")
    last = autoscale.get("last_rescale")
    if last:
        lines.append(f"last rescale ({autoscale['rescales']} recorded): {rescale_text(last)}")
    if autoscale.get("scale_up_held"):
        lines.append(f"scale-ups held: {autoscale['scale_up_held']}; `savepoints apply {job} --retry` clears it")
    return lines


def recommended(recommendation: dict[str, Any], autoscale: dict[str, Any]) -> str:
    """A recommendation in words: what it says to do, whether it is acted on, and its reason."""
    direction, size = recommendation["direction"], recommendation["size"]
    if direction in ("up", "down"):
        acted = "" if autoscale["mode"] == "active" else " (passive: not acted on)"
        partitions = f", state to {recommendation['partitions']} partitions" if recommendation.get("partitions") else ""
        said = f"scale {direction} {recommendation['current']} -> {size}{partitions}{acted}"
    elif direction == "hold":
        said = f"hold at {size}"
    else:
        said = f"keep {size}"
    behind = "; BEHIND AT ITS MAX SIZE" if recommendation.get("behind_at_max") else ""
    return f"{said}{behind}: {recommendation['reason']}"


def rescale_text(rescale: dict[str, Any]) -> str:
    """One rescale of the record (decide.py `Rescale`, as a dict): sizes, outcome, its time to the cutover."""
    partitions = f", state to {rescale['partitions']} partitions" if rescale.get("partitions") else ""
    outcome = rescale.get("outcome") or "under way"
    took = f" in {rescale['seconds']:.0f} s" if rescale.get("seconds") is not None else ""
    effective = rescale.get("effective")  # a scale-up's check, once the new size had a window of its own
    checked = "" if effective is None else ", effective" if effective else ", INEFFECTIVE"
    sizes = f"{rescale['from_size']} -> {rescale['to_size']}{partitions}"
    return f"{sizes}, {outcome}{took}{checked} ({utc_stamp(rescale['at'])})"
