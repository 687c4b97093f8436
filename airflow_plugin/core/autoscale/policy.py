"""What a job's `autoscale = {...}` declares (docs/jobs-file.md, "autoscale"), and the knob it turns.

The knob is the job's parallelism: on a local master the cores of `local[N]`, on a cluster the executors
(`spark.executor.instances`, each of `spark.executor.cores`, 1 unless set). Its task slots are what the state's
partitions are shared over: a size with more slots than partitions leaves slots idle, so with `partitions =
"follow"` a scale-up past them repartitions the state to the new slots (from the upgrade's savepoint), and a
scale-down never shrinks them (a rescale of the state costs a Spark application; idle partitions cost little)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from ..durations import duration_seconds
from ..errors import InvalidInput
from .load import KEEP_S

EXECUTORS_CONF = "spark.executor.instances"
EXECUTOR_CORES_CONF = "spark.executor.cores"
DYNAMIC_CONF = "spark.dynamicAllocation.enabled"
_LOCAL = re.compile(r"^local\[(\d+|\*)(,\d+)?\]$")


class Knob(StrEnum):
    CORES = "cores"  # N of local[N]: the driver's own task slots
    EXECUTORS = "executors"  # spark.executor.instances on a cluster


class Mode(StrEnum):
    ACTIVE = "active"  # recommends, and rescales through an upgrade
    PASSIVE = "passive"  # recommends and records, acts never: where a team starts


class Partitions(StrEnum):
    FOLLOW = "follow"  # a scale-up past the state's partitions repartitions it to the new task slots
    FIXED = "fixed"  # the state's partitions never change: a size is capped at them


@dataclass(frozen=True)
class Autoscale:
    """A job's autoscaler, as the jobs file declares it; durations in seconds."""

    max: int
    min: int = 1
    mode: Mode = Mode.ACTIVE
    knob: Knob | None = None  # None: cores on a local master, else executors
    target_utilization: float = 0.7  # the share of the time the job should spend running batches
    boundary: float = 0.2  # no scale-down while the utilisation is within this of the target
    window: float = 300.0  # the load a scale-up reads; a scale-up needs the backlog growing across it
    scale_down_window: float = 900.0  # the quiet a scale-down needs: longer, so that a lull is not taken for one
    cooldown: float = 300.0  # after a rescale, no other before this: the new size's own load is read first
    catch_up: float = 300.0  # the time a scale-up gives itself to work off the backlog
    restart_time: float = 60.0  # what a rescale is expected to cost until one was measured
    max_rescales_per_hour: int = 2
    partitions: Partitions = Partitions.FOLLOW

    def knob_for(self, master: str) -> Knob:
        return self.knob or (Knob.CORES if _LOCAL.match(master) else Knob.EXECUTORS)


DURATIONS = ("window", "scale_down_window", "cooldown", "catch_up", "restart_time")


def parse_autoscale(value: Any, master: str, where: str) -> Autoscale | None:
    """`autoscale = { max = 8, min = 2, target_utilization = 0.7, mode = "passive", ... }`: every error names the
    key and what it takes."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} autoscale must be a table, e.g. autoscale = {{ max = 4 }}")
    allowed = {f.name for f in fields(Autoscale)}
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InvalidInput(
            f"{where} autoscale has unknown key(s) {', '.join(unknown)}: known are {', '.join(sorted(allowed))}"
        )
    if "max" not in value:
        raise InvalidInput(
            f"{where} autoscale needs max: the largest size it may give the job, e.g. autoscale = {{ max = 4 }}"
        )
    size_max = _whole(value["max"], f"{where} autoscale.max", 1)
    size_min = _whole(value.get("min", 1), f"{where} autoscale.min", 1)
    if size_min > size_max:
        raise InvalidInput(
            f"{where} autoscale.min = {size_min} is above autoscale.max = {size_max}: lower min or raise max"
        )
    target = _share(
        value.get("target_utilization", Autoscale.target_utilization), f"{where} autoscale.target_utilization"
    )
    boundary = _share(value.get("boundary", Autoscale.boundary), f"{where} autoscale.boundary", zero=True)
    if boundary >= target:
        raise InvalidInput(
            f"{where} autoscale.boundary = {boundary:g} is not below target_utilization = {target:g}: a job under "
            f"{target - boundary:g} busy would never be quiet; give a smaller boundary"
        )
    durations = {
        key: duration_seconds(
            value.get(key, getattr(Autoscale, key)), f"{where} autoscale.{key}", bare_unit="s", positive=True
        )
        for key in DURATIONS
    }
    if durations["scale_down_window"] < durations["window"]:
        raise InvalidInput(
            f"{where} autoscale.scale_down_window is shorter than autoscale.window: a scale-down needs the longer quiet"
        )
    if durations["scale_down_window"] > KEEP_S:
        raise InvalidInput(
            f"{where} autoscale.scale_down_window = {durations['scale_down_window']:g} s is longer than the "
            f"{KEEP_S} s of load a job's runtime keeps: it would never be covered, and the job never scaled down; "
            f'give at most "{KEEP_S // 60}m"'
        )
    policy = Autoscale(
        max=size_max,
        min=size_min,
        mode=_choice(Mode, value.get("mode", Mode.ACTIVE), f"{where} autoscale.mode"),
        knob=_choice(Knob, value["knob"], f"{where} autoscale.knob") if "knob" in value else None,
        target_utilization=target,
        boundary=boundary,
        max_rescales_per_hour=_whole(
            value.get("max_rescales_per_hour", Autoscale.max_rescales_per_hour),
            f"{where} autoscale.max_rescales_per_hour",
            0,
        ),
        partitions=_choice(Partitions, value.get("partitions", Partitions.FOLLOW), f"{where} autoscale.partitions"),
        **durations,
    )
    knob = policy.knob_for(master)
    if knob is Knob.CORES and not _LOCAL.match(master):
        raise InvalidInput(
            f'{where} autoscale.knob = "cores" turns N of a local[N] master, and spark_master is {master}: use '
            '"executors" on a cluster'
        )
    if _LOCAL.match(master) and "*" in master and knob is Knob.CORES:
        raise InvalidInput(f"{where} spark_master {master} has no size to turn: write local[N] for the autoscaler")
    return policy


def size_of(knob: Knob, master: str, conf: dict[str, str]) -> int:
    """The job's size on the knob, as its master and confs give it (1 where they say nothing)."""
    if knob is Knob.CORES:
        found = _LOCAL.match(master)
        return int(found.group(1)) if found and found.group(1) != "*" else 1
    return int(conf.get(EXECUTORS_CONF, "1") or 1)


def slots_per_unit(knob: Knob, conf: dict[str, str]) -> int:
    """The task slots one unit of the knob gives: a core, or an executor's cores (what the state's partitions are
    shared over)."""
    return 1 if knob is Knob.CORES else int(conf.get(EXECUTOR_CORES_CONF, "1") or 1)


def sized(knob: Knob, size: int, master: str, conf: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The master and confs of the job at `size`: a local master's cores, or a fixed number of executors (Spark's
    dynamic allocation off: the autoscaler owns the count)."""
    if knob is Knob.CORES:
        found = _LOCAL.match(master)
        failures = (found.group(2) or "") if found else ""
        return f"local[{size}{failures}]", dict(conf)
    return master, {**conf, EXECUTORS_CONF: str(size), DYNAMIC_CONF: "false"}


def _whole(value: Any, where: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidInput(f"{where} = {value!r}: give a whole number of at least {least}")
    return value


def _share(value: Any, where: str, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{where} = {value!r}: give a share between 0 and 1, e.g. 0.7")
    if not (0 <= value < 1 if zero else 0 < value <= 1):
        raise InvalidInput(f"{where} = {value!r}: give a share between 0 and 1, e.g. 0.7")
    return float(value)


def _choice(kind: type[StrEnum], value: Any, where: str) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        raise InvalidInput(f"{where} = {value!r}: use one of {', '.join(repr(str(k)) for k in kind)}") from None
