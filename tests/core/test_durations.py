"""The one duration grammar (core/durations.py): the forms it accepts, what a plain number means, what it
refuses and how the refusal reads, and the formatter that writes durations back in it."""

from __future__ import annotations

import argparse

import pytest

from airflow_plugin.core.durations import FORMS, duration_argument, duration_seconds, format_duration
from airflow_plugin.core.errors import InvalidInput

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("90 seconds", 90.0),
        ("1 second", 1.0),
        ("1.5 s", 1.5),
        ("2 sec", 2.0),
        ("500ms", 0.5),
        ("500 milliseconds", 0.5),
        ("2m", 2 * MINUTE),
        ("2 min", 2 * MINUTE),
        ("2 minutes", 2 * MINUTE),
        ("1h", HOUR),
        ("1 hour", HOUR),
        ("2 hours", 2 * HOUR),
        ("1.5 hours", 1.5 * HOUR),
        ("2d", 2 * DAY),
        ("2 days", 2 * DAY),
        ("1w", 7 * DAY),
        ("1 week", 7 * DAY),
        ("3 weeks", 21 * DAY),
        ("  2 DAYS  ", 2 * DAY),  # case-insensitive, spaces around
        ("1 Hour", HOUR),
        ("0s", 0.0),
    ],
)
def test_accepted_forms(text: str, seconds: float) -> None:
    assert duration_seconds(text, "setting") == pytest.approx(seconds)


def test_a_plain_number_counts_the_unit_its_setting_names_and_needs_a_unit_elsewhere() -> None:
    assert duration_seconds(600, "timeout", bare_unit="s") == 600.0
    assert duration_seconds(1.5, "timeout", bare_unit="s") == 1.5
    assert duration_seconds(" 600 ", "timeout", bare_unit="s") == 600.0  # a command line's text
    with pytest.raises(InvalidInput, match=r"^trigger_interval = '5' needs a unit: give a number and a unit"):
        duration_seconds("5", "trigger_interval")
    with pytest.raises(InvalidInput, match=r"^trigger_interval = 5 needs a unit"):
        duration_seconds(5, "trigger_interval")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is not a duration"),
        ("   ", "is not a duration"),
        ("soon", "is not a duration"),
        ("1 hour 5 minutes", "is not a duration"),  # no compounds
        ("1h5m", "is not a duration"),
        ("2 fortnights", "has an unknown unit 'fortnights'"),
        ("2 months", "has an unknown unit 'months'"),
        ("1e3s", "is not a duration"),
        ("-5s", "must not be negative"),
        ("-1 day", "must not be negative"),
        (-1, "must not be negative"),
        (True, "is not a duration"),
        (None, "is not a duration"),
        (["5s"], "is not a duration"),
        (float("inf"), "is not a duration"),
        (float("nan"), "is not a duration"),
    ],
)
def test_refusals_name_the_setting_and_list_the_accepted_forms(value: object, problem: str) -> None:
    with pytest.raises(InvalidInput) as info:
        duration_seconds(value, "jobs.toml [jobs.orders] heartbeat_timeout", bare_unit="s")
    message = str(info.value)
    assert message.startswith(f"jobs.toml [jobs.orders] heartbeat_timeout = {value!r} {problem}: give "), message
    assert FORMS in message and message.endswith("or a plain number of seconds")
    for unit in ("ms", "seconds", "minutes", "hours", "days", "weeks", '"2 days"', '"1 hour"'):
        assert unit in message


def test_zero_is_refused_where_the_setting_must_be_positive() -> None:
    assert duration_seconds("0 s", "max_age") == 0.0
    with pytest.raises(InvalidInput, match=r"^trigger_interval = '0 s' must be longer than 0"):
        duration_seconds("0 s", "trigger_interval", positive=True)
    with pytest.raises(InvalidInput, match=r"^timeout = 0 must be longer than 0"):
        duration_seconds(0, "timeout", bare_unit="s", positive=True)


def test_as_an_argparse_type_a_refusal_is_a_usage_error_naming_the_option() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--timeout", type=duration_argument("--timeout", bare_unit="s", positive=True))
    assert parser.parse_args(["--timeout", "5m"]).timeout == 300.0
    assert parser.parse_args(["--timeout", "45"]).timeout == 45.0
    with pytest.raises(argparse.ArgumentError, match=r"--timeout = 'soon' is not a duration: give"):
        parser.parse_args(["--timeout", "soon"])


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(2 * DAY, "2d"), (7 * DAY, "1w"), (90 * MINUTE, "90m"), (HOUR, "1h"), (90.0, "90s"), (0.5, "0.5s"), (0, "0s")],
)
def test_format_writes_the_shortest_exact_form_which_reads_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert duration_seconds(format_duration(seconds), "round trip") == seconds
