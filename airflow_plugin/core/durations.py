"""The one grammar of durations, for every setting that is a length of time: the jobs file's
(`trigger_interval`, `heartbeat_timeout`, `preflight_timeout`, a script's `start_timeout`, `kafka.timeout`,
every retention duration), the command line's flags and the job runtime's (`--trigger-interval`, a job's
`state_horizon`).

A duration is a number (`2`, `1.5`), optionally spaces, and a unit, case-insensitive, with spaces around:

    ms  millisecond  milliseconds                 "500ms", "500 milliseconds"
    s   sec  secs  second  seconds                "90s", "1.5 s", "90 seconds"
    m   min  mins  minute  minutes                "2m", "2 min", "2 minutes"
    h   hr   hrs   hour    hours                  "1h", "1 hour", "2 hours"
    d   day  days                                 "2d", "2 days"
    w   week weeks                                "1w", "1 week"

A plain number (`600`, or "600" from a command line) is accepted only where the setting says what it counts
(`bare_unit`, seconds everywhere today). Refused, with an error that names the setting and lists these forms:
a negative or empty value, an unknown unit, compounds ("1 hour 5 minutes"), non-finite numbers, booleans.
`format_duration` writes seconds back in the shortest exact form of this grammar ("2d", "90s")."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from .errors import InvalidInput

_SECONDS_PER_UNIT = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400.0),
}
_UNIT_NAMES = {"s": "seconds"}  # what a plain number counts, by `bare_unit`
_DURATION = re.compile(r"^\s*([-+]?)(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
FORMS = (
    'a number and a unit, e.g. "500ms", "90s", "1.5 s", "2 min", "1 hour", "2 days", "1 week" (units: ms, s, '
    "m, h, d, w, or spelled out: milliseconds, seconds, minutes, hours, days, weeks)"
)
# the shortest exact spelling of a number of seconds, largest unit first (format_duration)
_FORMAT_UNITS = (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60))


def duration_seconds(value: Any, setting: str, *, bare_unit: str | None = None, positive: bool = False) -> float:
    """The seconds of `value`, a duration of the one grammar; InvalidInput naming `setting` otherwise.

    `bare_unit` ("s"): a plain number (a TOML number, or text such as "600") counts that unit; None: a plain
    number is refused (it needs a unit). `positive`: 0 is refused too (an interval, a timeout)."""
    if isinstance(value, bool):
        raise InvalidInput(_refusal(value, setting, "is not a duration", bare_unit))
    if isinstance(value, int | float):
        if bare_unit is None:
            raise InvalidInput(_refusal(value, setting, "needs a unit", bare_unit))
        number, unit, sign = float(abs(value)), bare_unit, "-" if value < 0 else ""
    else:
        match = _DURATION.match(value) if isinstance(value, str) else None
        if not match:
            raise InvalidInput(_refusal(value, setting, "is not a duration", bare_unit))
        if match.group(3) and match.group(3).lower() not in _SECONDS_PER_UNIT:
            raise InvalidInput(_refusal(value, setting, f"has an unknown unit {match.group(3)!r}", bare_unit))
        if not match.group(3) and bare_unit is None:
            raise InvalidInput(_refusal(value, setting, "needs a unit", bare_unit))
        sign, number, unit = match.group(1), float(match.group(2)), (match.group(3) or bare_unit or "").lower()
    if not math.isfinite(number):
        raise InvalidInput(_refusal(value, setting, "is not a duration", bare_unit))
    if sign == "-" and number:
        raise InvalidInput(_refusal(value, setting, "must not be negative", bare_unit))
    if positive and not number:
        raise InvalidInput(_refusal(value, setting, "must be longer than 0", bare_unit))
    return number * _SECONDS_PER_UNIT[unit]


def duration_argument(setting: str, *, bare_unit: str | None = None, positive: bool = False) -> Callable[[str], float]:
    """`duration_seconds` as an argparse `type`: a bad value is argparse's usage error (exit 2), naming the
    option and the accepted forms."""

    def parse(text: str) -> float:
        try:
            return duration_seconds(text, setting, bare_unit=bare_unit, positive=positive)
        except InvalidInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def format_duration(seconds: float) -> str:
    """Seconds in the largest unit that holds them exactly, as the grammar reads them back: 172800 -> "2d",
    5400 -> "90m", 90 -> "90s", 0.5 -> "0.5s"."""
    for unit, length in _FORMAT_UNITS:
        if seconds >= length and seconds % length == 0:
            return f"{int(seconds // length)}{unit}"
    return f"{seconds:g}s"


def _refusal(value: Any, setting: str, problem: str, bare_unit: str | None) -> str:
    plain = f", or a plain number of {_UNIT_NAMES.get(bare_unit, bare_unit)}" if bare_unit else ""
    return f"{setting} = {value!r} {problem}: give {FORMS}{plain}"
