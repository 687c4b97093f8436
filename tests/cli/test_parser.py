"""The command line's shape (issue 43): a job given the same way in every command (JOB; the old `--job JOB`
still works, with a note), global options before or after the command, `--version`, help for every argument,
options only where they act, one exit code table in the code, the help and docs/command-line.md."""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.cli import exit_codes, main
from airflow_plugin.cli.commands import snapshots
from airflow_plugin.cli.options import GLOBAL_DEFAULTS
from airflow_plugin.cli.parser import build_parser, parse
from airflow_plugin.core import errors
from tests.support.synthetic import write_checkpoint

REPO = Path(__file__).resolve().parents[2]
DEPRECATED = "`--job JOB` is deprecated"

# What a command's JOB is, per command; the commands that took `--job JOB` before take it still.
JOB_POSITIONAL = {
    "create": "required",
    "list": "optional",
    "show": "required",
    "verify": "required",
    "delete": "required",
    "pin": "required",
    "unpin": "required",
    "restore": "required",
    "deploy": "required",
    "preflight": "required",
    "status": "optional",
    "stop": "required",
    "savepoint": "required",
    "kill": "required",
    "lease": "optional",
    "prune": "optional",
    "retain": "required",
    "checkpoint": "required",
    "upgrade": "required",
    "catalog": "optional",
    "metrics": "many",
    "apply": "many",
    "inspect": "required",
    "diff": "required",
}
HAD_JOB_OPTION = {
    "create", "list", "show", "verify", "delete", "pin", "unpin", "restore", "prune", "retain", "checkpoint",
    "catalog", "metrics", "inspect", "diff",
}  # fmt: skip
# Where the option acts (read from the engine): a Kafka check (or the broker handed to a driver); transfers.
KAFKA_COMMANDS = {"list", "show", "restore", "prune", "deploy", "preflight", "upgrade"}
CONCURRENCY_COMMANDS = {
    "create", "verify", "restore", "inspect", "diff", "savepoint", "stop", "retain", "checkpoint", "deploy", "upgrade",
}  # fmt: skip


def commands() -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


# ---------------------------------------------------------------------------------------------- the job


def test_every_command_takes_its_job_as_the_positional_JOB() -> None:
    found = {}
    for name, parser in commands().items():
        jobs = [a for a in parser._actions if a.dest == "job"]
        if not jobs:
            continue
        [job] = jobs
        assert not job.option_strings and job.metavar == "JOB", name
        assert job.help, f"{name}: JOB has no help"
        found[name] = {None: "required", "?": "optional", "*": "many"}[job.nargs]  # type: ignore[index]
    assert found == JOB_POSITIONAL
    assert set(commands()) - set(found) == {"install-dags"}


@pytest.mark.parametrize(
    ("new", "old"),
    [
        (["create", "orders", "--checkpoint", "c"], ["create", "--job", "orders", "--checkpoint", "c"]),
        (["list", "orders"], ["list", "--job", "orders"]),
        (["show", "orders", "latest"], ["show", "--job", "orders", "latest"]),
        (["verify", "orders", "sp-1", "--deep"], ["verify", "sp-1", "--deep", "--job=orders"]),
        (["delete", "orders", "sp-1"], ["delete", "sp-1", "--job", "orders"]),
        (["pin", "orders", "latest"], ["pin", "--job", "orders", "latest"]),
        (["unpin", "orders", "latest"], ["unpin", "--job", "orders", "latest"]),
        (["restore", "orders", "latest", "--to", "t"], ["restore", "--job", "orders", "latest", "--to", "t"]),
        (["prune", "orders", "--dry-run"], ["prune", "--job", "orders", "--dry-run"]),
        (["retain", "orders"], ["retain", "--job", "orders"]),
        (["catalog", "check", "orders"], ["catalog", "--job", "orders", "check"]),
        (["metrics", "a", "b"], ["metrics", "--job", "a", "--job", "b"]),
        (["inspect", "orders", "latest", "--key", "k"], ["inspect", "--job", "orders", "latest", "--key", "k"]),
        (["diff", "orders", "sp-1", "latest"], ["diff", "--job", "orders", "sp-1", "latest"]),
        (["show", "orders", "latest"], ["show", "--job", "orders", "orders", "latest"]),  # both ways, the same
    ],
)
def test_the_old_job_option_still_works_with_a_note(
    capsys: pytest.CaptureFixture[str], new: list[str], old: list[str]
) -> None:
    parsed = parse(new)
    assert DEPRECATED not in capsys.readouterr().err
    assert vars(parse(old)) == vars(parsed)
    err = capsys.readouterr().err
    assert err.count(DEPRECATED) == 1 and len(err.strip().splitlines()) == 1, err
    assert f"give the job as the argument JOB: `savepoints {new[0]} " in err


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "--job", "orders", "payments", "latest"],
        ["list", "payments", "--job", "orders"],
        ["create", "payments", "--job", "orders", "--checkpoint", "c"],
        ["show", "--job", "orders", "--job", "payments", "latest"],
        ["metrics", "a", "--job", "b"],
    ],
)
def test_a_job_given_both_ways_differently_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    err = capsys.readouterr().err
    assert exited.value.code == exit_codes.USAGE and "differently" in err and "give" in err, err


@pytest.mark.parametrize("command", sorted(set(JOB_POSITIONAL) - HAD_JOB_OPTION))
def test_commands_that_never_had_the_job_option_refuse_it(capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Before, their `--job x` was an abbreviation of `--jobs x`: a jobs file named x."""
    argv = [command, "--job", "orders"] + (["list"] if command == "lease" else [])
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--job is not an option of this command: give the job as JOB" in err, err


def test_a_missing_job_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["create", "--checkpoint", "c"], ["retain"], ["kill"], ["show", "--job", "orders"]):
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        assert exited.value.code == 2, argv
        assert "the following arguments are required" in capsys.readouterr().err


def test_the_job_reaches_the_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2)
    assert main(["create", "orders", "--store", store, "--checkpoint", str(ckpt)]) == 0
    assert main(["create", "--job", "payments", "--store", store, "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    assert main(["list", "payments", "--store", store, "--json"]) == 0
    assert {row["job"] for row in _json(capsys)} == {"payments"}
    assert main(["list", "--job", "orders", "--store", store, "--json"]) == 0
    assert {row["job"] for row in _json(capsys)} == {"orders"}


# ---------------------------------------------------------------------------------------------- global options


@pytest.mark.parametrize("command", sorted(set(commands()) - {"checkpoint"}))
def test_global_options_mean_the_same_before_and_after_the_command(command: str) -> None:
    parser = commands()[command]
    positionals = {"lease": ["list"], "catalog": ["check"], "install-dags": ["dags"]}.get(command, [])
    positionals = positionals or {"required": ["orders"]}.get(JOB_POSITIONAL.get(command, ""), [])
    positionals += ["latest"] * sum(1 for a in parser._actions if a.dest in ("id", "a", "b"))
    required = {"create": ["--checkpoint", "c"], "restore": ["--to", "t"], "preflight": ["--version", "v2"]}
    required["upgrade"] = ["--version", "v2"]
    argv = [command, *positionals, *required.get(command, [])]
    given = ["--jobs", "j.toml", "--store", "s3://b/p", "--json", "-v"]
    before, after = vars(parse([*given, *argv])), vars(parse([*argv, *given]))
    assert before == after
    assert {k: before[k] for k in GLOBAL_DEFAULTS} == {
        "jobs": "j.toml",
        "store": "s3://b/p",
        "json": True,
        "verbose": True,
    }
    assert {k: vars(parse(argv))[k] for k in GLOBAL_DEFAULTS} == GLOBAL_DEFAULTS  # given nowhere: the defaults


def test_a_global_option_given_before_and_after_the_command_the_one_after_wins() -> None:
    args = parse(["--store", "s3://before/x", "--jobs", "before.toml", "list", "--store", "s3://after/x"])
    assert (args.store, args.jobs) == ("s3://after/x", "before.toml")
    help_text = build_parser().format_help()
    assert "before or after the command; given in both places, the one after it wins" in help_text


def test_global_options_before_the_command_act(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    assert main(["--json", "--store", store, "list"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert main(["-v", "--store", "s3://", "list"]) == 2  # the store given before the command is the one used
    assert "malformed S3 URI" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- --version


def test_version_prints_the_package_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"savepoints {importlib.metadata.version('spark-savepoints')}"
    result = subprocess.run([sys.executable, "-m", "airflow_plugin", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("savepoints ")
    # a command's own --version (the job's version) is untouched
    assert parse(["deploy", "orders", "--version", "v2"]).version == "v2"


# ---------------------------------------------------------------------------------------------- help and options


def test_every_argument_of_every_command_has_help() -> None:
    listed = {
        choice.dest
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for choice in action._choices_actions
    }
    assert listed == set(commands()) - {"checkpoint"}  # the old name works, unlisted
    for action in build_parser()._actions:
        assert action.help and action.help != argparse.SUPPRESS, action
    for name, parser in commands().items():
        for action in parser._actions:
            assert action.help and action.help != argparse.SUPPRESS, f"{name}: {action.dest} has no help"


def test_kafka_and_concurrency_are_offered_only_where_they_act(capsys: pytest.CaptureFixture[str]) -> None:
    offered = {name: option_strings(parser) for name, parser in commands().items()}
    assert {name for name, options in offered.items() if "--kafka-bootstrap" in options} == KAFKA_COMMANDS
    assert {name for name, options in offered.items() if "--concurrency" in options} == CONCURRENCY_COMMANDS
    for argv in (["kill", "orders", "--kafka-bootstrap", "h:9092"], ["list", "--concurrency", "4"]):
        err = _refused(capsys, argv)
        assert f"savepoints {argv[0]}: error: {argv[-2]} is not an option of `savepoints {argv[0]}`: only " in err
    assert "--kafka-bootstrap" not in commands()["verify"].format_help()
    assert "--concurrency" in commands()["restore"].format_help()


def test_the_kafka_option_reaches_the_check_where_it_is_offered(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    assert (
        main(["create", "orders", "--store", store, "--checkpoint", str(write_checkpoint(tmp_path / "c", batches=2))])
        == 0
    )
    brokers: list[Any] = []
    real = snapshots.source_guard.assess
    monkeypatch.setattr(
        snapshots.source_guard, "assess", lambda found, kafka: brokers.append(kafka) or real(found, None)
    )
    assert main(["list", "--store", store, "--kafka-bootstrap", "broker:9092"]) == 0
    assert [b.bootstrap_servers for b in brokers] == ["broker:9092"]


# ------------------------------------------------------------------------------------- unknown options (issue 53)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """A usage error (exit code 2) before any command ran: its message, one line."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    [message] = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert exited.value.code == exit_codes.USAGE, message
    return message


def test_an_option_the_command_does_not_take_is_refused_before_its_value_is_read_as_the_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, ADDR became JOB: "the job is given twice, differently: JOB ADDR and --job X"."""
    err = _refused(capsys, ["create", "--job", "X", "--kafka-bootstrap", "ADDR", "--checkpoint", "c"])
    assert "differently" not in err and "ADDR" not in err, err
    kafka = ", ".join(name for name in commands() if name in KAFKA_COMMANDS)
    assert err.endswith(
        f"--kafka-bootstrap is not an option of `savepoints create`: only {kafka} take it "
        "(`savepoints create --help` lists its options)"
    ), err


def test_an_option_of_some_commands_before_the_command_is_refused_naming_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, ADDR was read as the command: "invalid choice: 'ADDR'"; after the command it works."""
    err = _refused(capsys, ["--kafka-bootstrap", "ADDR", "list", "X"])
    kafka = ", ".join(name for name in commands() if name in KAFKA_COMMANDS)
    assert err == (
        f"savepoints: error: --kafka-bootstrap is an option of {kafka} only, not a global one: give it after the "
        "command: `savepoints list X --kafka-bootstrap ADDR`"
    )
    assert parse(["list", "X", "--kafka-bootstrap", "ADDR"]).kafka_bootstrap == "ADDR"
    err = _refused(capsys, ["--store", "s", "--concurrency=4", "restore", "X", "latest", "--to", "t"])
    assert err.endswith("give it after the command: `savepoints --store s restore X latest --to t --concurrency=4`")
    concurrency = ", ".join(name for name in commands() if name in CONCURRENCY_COMMANDS - {"checkpoint"})
    assert f"--concurrency is an option of {concurrency} only" in err
    err = _refused(capsys, ["--kafka-bootstrap", "ADDR", "kill", "X"])
    assert err.endswith("give it after the command; `savepoints kill` does not take it"), err
    err = _refused(capsys, ["--dry-run", "prune", "X"])  # an option without a value: the command is the next word
    assert err.endswith("`savepoints prune X --dry-run`"), err


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--no-such-option", "X"],
        ["list", "X", "--no-such-option"],
        ["list", "--no-such-option=3", "X"],
        ["--json", "list", "--no-such-option", "X", "--store", "s"],
    ],
)
def test_an_unknown_option_is_reported_as_unknown_with_the_command_s_options(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    err = _refused(capsys, argv)
    assert err == (
        "savepoints list: error: unknown option --no-such-option: `savepoints list` takes --kafka-bootstrap and the "
        "global options --jobs, --store, --json, -v/--verbose (`savepoints list --help`)"
    )


def test_an_unknown_option_before_the_command_is_reported_as_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, ["--no-such-option", "X", "list"])
    assert err == (
        "savepoints: error: unknown option --no-such-option (the global options: --version, --jobs, --store, "
        "--json, -v/--verbose; `savepoints --help`)"
    )


def test_words_that_argparse_reads_as_values_are_not_options() -> None:
    assert parse(["list", "--", "-x"]).job == "-x"  # after `--`, a word is never an option
    assert parse(["restore", "o", "latest", "--to", "t", "--concurrency", "-1"]).concurrency == -1
    assert parse(["list", "--kafka", "b:9092"]).kafka_bootstrap == "b:9092"  # a command's abbreviations still work
    assert parse(["--store", "list", "list"]).store == "list"  # a global option's value is not the command


# ---------------------------------------------------------------------------------------------- the rename


def test_retain_was_checkpoint_which_still_works_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["retain", "orders"]).job == "orders"
    assert capsys.readouterr().err == ""
    old = parse(["checkpoint", "--job", "orders"])
    err = capsys.readouterr().err
    assert old.job == "orders" and old.run is parse(["retain", "orders"]).run
    assert "`savepoints checkpoint` is deprecated: it is now `savepoints retain`" in err
    assert "`savepoints retain JOB`" in err


# ---------------------------------------------------------------------------------------------- exit codes


def test_each_exit_code_is_listed_once_and_every_engine_error_has_one() -> None:
    codes = [row.code for row in exit_codes.EXIT_CODES]
    assert len(codes) == len(set(codes)) and codes == sorted(codes)
    for constant in (exit_codes.OK, exit_codes.UNEXPECTED, exit_codes.USAGE, exit_codes.INTERRUPTED):
        assert constant in codes
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.SavepointsError) and cls is not errors.SavepointsError:
            assert exit_codes.exit_code(cls("x")) != exit_codes.UNEXPECTED, f"{cls.__name__} has no exit code"


def test_the_help_and_the_docs_show_the_exit_code_table_of_the_code() -> None:
    help_text = " ".join(build_parser().format_help().split())
    for row in exit_codes.EXIT_CODES:
        assert f" {row.code} {row.meaning}" in help_text, row
    page = (REPO / "docs" / "command-line.md").read_text()
    match = re.search(r"^\| exit code \| meaning \|\n(?:\|.*\|\n?)+", page, re.M)
    assert match, "docs/command-line.md has no exit code table"
    assert match.group(0).strip() == exit_codes.markdown(), (
        "docs/command-line.md's exit code table differs from airflow_plugin/cli/exit_codes.py; the table is:\n"
        + exit_codes.markdown()
    )


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    import json

    return json.loads(capsys.readouterr().out)
