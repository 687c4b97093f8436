"""The `savepoints` command line: output formats, exit codes, and every bad input with a check that
the message names the problem AND that nothing was written or deleted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from devtools.embedded_s3 import EmbeddedS3
from tests.support.synthetic import tree, write_checkpoint


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    code, out, _ = run(capsys, *argv, "--json")
    return code, json.loads(out)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return str(tmp_path / "store")


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "ckpt", batches=3)


def test_create_list_show_verify_restore_delete(
    capsys: pytest.CaptureFixture[str], store: str, ckpt: Path, tmp_path: Path
) -> None:
    code, created = run_json(
        capsys,
        "create",
        "orders",
        "--store",
        store,
        "--checkpoint",
        str(ckpt),
        "--label",
        "team=payments",
        "--pin",
    )
    assert code == 0
    assert {"id", "batch_id", "status", "files", "bytes", "uploaded_bytes"} <= created.keys()
    assert created["status"] == "COMPLETED" and created["batch_id"] == 2 and created["pinned"] is True
    assert created["labels"] == {"team": "payments"}

    code, out, _ = run(capsys, "list", "--store", store)
    assert code == 0 and created["id"] in out and "COMPLETED" in out
    assert "labels" in out.splitlines()[0] and "team=payments" in out  # the labels column
    code, listed = run_json(capsys, "list", "orders", "--store", store)
    assert [row["id"] for row in listed] == [created["id"]]

    code, shown = run_json(capsys, "show", "orders", "--store", store, "latest")
    assert shown["id"] == created["id"] and shown["query_id"]

    code, verified = run_json(capsys, "verify", "orders", "--store", store, created["id"])
    assert code == 0 and verified["ok"] is True

    target = tmp_path / "restored"
    code, plan = run_json(capsys, "restore", "orders", "--store", store, "latest", "--to", str(target), "--dry-run")
    assert code == 0 and plan["dry_run"] is True and plan["resumes_at_batch"] == 3 and not target.exists()
    code, out, _ = run(capsys, "restore", "orders", "--store", store, "latest", "--to", str(target))
    assert code == 0 and "resumes at batch 3" in out and "spark.sql.shuffle.partitions=2" in out
    assert (target / "commits/2").exists()

    code, _, err = run(capsys, "delete", "orders", "--store", store, created["id"])
    assert code == 4 and "is pinned" in err
    assert run(capsys, "unpin", "orders", "--store", store, created["id"])[0] == 0
    assert run(capsys, "delete", "orders", "--store", store, created["id"])[0] == 0
    assert run_json(capsys, "list", "--store", store)[1] == []


def test_store_from_environment(
    capsys: pytest.CaptureFixture[str], store: str, ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAVEPOINTS_STORE", store)
    code, created = run_json(capsys, "create", "orders", "--checkpoint", str(ckpt))
    assert code == 0 and Path(store, "jobs/orders/snapshots", created["id"], "manifest.json").exists()


@pytest.mark.parametrize(
    ("setup", "code", "message"),
    [
        ("missing", 3, "does not exist or is empty"),
        ("empty", 3, "does not exist or is empty"),
        ("not_spark", 5, "is not a Spark checkpoint (no 'metadata' file)"),
        ("uncommitted", 5, "has no committed batch yet"),
    ],
)
def test_bad_checkpoint_writes_nothing(
    capsys: pytest.CaptureFixture[str], store: str, tmp_path: Path, setup: str, code: int, message: str
) -> None:
    location = tmp_path / "location"
    if setup == "empty":
        location.mkdir()
    elif setup == "not_spark":
        location.mkdir()
        (location / "part-0000.parquet").write_bytes(b"PAR1")
    elif setup == "uncommitted":
        write_checkpoint(location, batches=0, pending=True)
    before = tree(location)
    got, _, err = run(capsys, "create", "orders", "--store", store, "--checkpoint", str(location))
    assert got == code and message in err
    assert tree(Path(store)) == {} and tree(location) == before


def test_unknown_job_and_snapshot(capsys: pytest.CaptureFixture[str], store: str, ckpt: Path) -> None:
    run_json(capsys, "create", "orders", "--store", store, "--checkpoint", str(ckpt))
    before = tree(Path(store))
    code, _, err = run(capsys, "show", "payments", "--store", store, "latest")
    assert code == 3 and "job 'payments' has no snapshots" in err
    code, _, err = run(capsys, "verify", "orders", "--store", store, "sp-20260101T000000000Z-0000")
    assert code == 3 and "snapshot sp-20260101T000000000Z-0000 of job orders does not exist" in err
    code, _, err = run(capsys, "delete", "orders", "--store", store, "../../etc")
    assert code == 2 and "invalid snapshot id" in err
    assert tree(Path(store)) == before


def test_restore_refusals_change_nothing(
    capsys: pytest.CaptureFixture[str], store: str, ckpt: Path, tmp_path: Path
) -> None:
    _, created = run_json(capsys, "create", "orders", "--store", store, "--checkpoint", str(ckpt))
    manifest_path = Path(store, "jobs/orders/snapshots", created["id"], "manifest.json")
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    code, _, err = run(capsys, "restore", "orders", "--store", store, "latest", "--to", str(target))
    assert code == 4 and "is not empty (it holds keep.txt)" in err and tree(target) == {"keep.txt": b"precious"}

    data = json.loads(manifest_path.read_text())
    for status in ("FAILED", "IN_PROGRESS"):
        manifest_path.write_text(json.dumps(data | {"status": status, "error": "boom"}))
        code, _, err = run(
            capsys, "restore", "orders", "--store", store, created["id"], "--to", str(tmp_path / "fresh")
        )
        assert code == 4 and f"is {status}: boom" in err and not (tmp_path / "fresh").exists()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["files"].__setitem__(0, ["../../etc/passwd", 1, "0" * 64, 0.0, "packs/00/0.pack", 0]),
            "is unsafe",
        ),
        (lambda d: d["files"].__setitem__(0, ["/etc/passwd", 1, "0" * 64, 0.0, "packs/00/0.pack", 0]), "is unsafe"),
        (lambda d: d["files"].__setitem__(0, ["metadata", 1, "0" * 64, 0.0, "packs/../../x.pack", 0]), "is unsafe"),
        (lambda d: d["files"].__setitem__(0, ["metadata", 1, "0" * 64, 0.0, "jobs/x/manifest.json", 0]), "is corrupt"),
        (lambda d: d["files"].__setitem__(0, ["metadata", 1, "0" * 64, 0.0]), "is corrupt"),  # no location
        (None, "is corrupt"),
    ],
)
def test_unsafe_or_corrupt_manifest(
    capsys: pytest.CaptureFixture[str], store: str, ckpt: Path, tmp_path: Path, mutate: object, message: str
) -> None:
    _, created = run_json(capsys, "create", "orders", "--store", store, "--checkpoint", str(ckpt))
    manifest_path = Path(store, "jobs/orders/snapshots", created["id"], "manifest.json")
    if mutate is None:
        manifest_path.write_text('{"id": "sp-broken", "files": [')
    else:
        data = json.loads(manifest_path.read_text())
        mutate(data)
        manifest_path.write_text(json.dumps(data))
    before = tree(Path(store))
    code, _, err = run(capsys, "restore", "orders", "--store", store, created["id"], "--to", str(tmp_path / "r"))
    assert code == 6 and message in err
    assert not (tmp_path / "r").exists() and not Path("/etc/passwd.restored").exists()
    assert tree(Path(store)) == before


def test_checksum_mismatch_fails_verify_and_restore(
    capsys: pytest.CaptureFixture[str], store: str, ckpt: Path, tmp_path: Path
) -> None:
    _, created = run_json(capsys, "create", "orders", "--store", store, "--checkpoint", str(ckpt))
    pack = next(p for p in Path(store, "packs").rglob("*.pack"))  # small files share packs
    stored = pack.read_bytes()
    pack.write_bytes(bytes([stored[0] ^ 0xFF]) + stored[1:])
    code, report = run_json(capsys, "verify", "orders", "--store", store, created["id"])
    assert code == 6 and report["ok"] is False and "checksum mismatch" in report["problems"][0]
    code, _, err = run(capsys, "restore", "orders", "--store", store, "latest", "--to", str(tmp_path / "r"))
    assert code == 6 and "does not match its checksum" in err and tree(tmp_path / "r") == {}


def test_malformed_store_uri(capsys: pytest.CaptureFixture[str], ckpt: Path) -> None:
    for uri, message in (
        ("s3://", "malformed S3 URI"),
        ("hdfs://nn/x", "not a snapshot store"),  # checkpoints and sinks may be on HDFS, the store may not
        ("s3://Bad_Bucket/x", "malformed S3 URI"),
    ):
        code, _, err = run(capsys, "create", "orders", "--store", uri, "--checkpoint", str(ckpt))
        assert code == 2 and message in err
    code, _, err = run(capsys, "list", "--store", "s3://AKIAEXAMPLE:topsecret@bucket/x")
    assert code == 2 and "credentials do not belong in the URI" in err and "topsecret" not in err


def test_missing_bucket(capsys: pytest.CaptureFixture[str], s3_server: object, ckpt: Path) -> None:
    code, _, err = run(capsys, "create", "orders", "--store", "s3://no-such-bucket-here/x", "--checkpoint", str(ckpt))
    assert code == 3 and "bucket 'no-such-bucket-here' does not exist" in err


def test_missing_credentials_never_print_a_secret(
    capsys: pytest.CaptureFixture[str],
    s3_server: EmbeddedS3,
    s3_store: str,
    ckpt: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from airflow_plugin.core.storage import s3 as s3_module

    monkeypatch.setattr(s3_module, "_clients", {})
    code, out, err = run(capsys, "create", "orders", "--store", s3_store, "--checkpoint", str(ckpt), "-v")
    assert code == 7 and "no AWS credentials" in err
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    assert s3_server.client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0  # nothing written

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-never-shown")
    monkeypatch.setattr(s3_module, "_clients", {})
    code, out, err = run(capsys, "list", "--store", s3_store)
    assert "s3cr3t-value-never-shown" not in out + err
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in out + err


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("novalue", "use KEY=VALUE"),
        ("note=two\nlines", "a line break or control character"),
        ("note=" + "x" * 300, "300 characters; use at most 256"),
        ("<b>=x", "invalid label key"),
        ("=x", "use KEY=VALUE"),
    ],
)
def test_bad_label(capsys: pytest.CaptureFixture[str], store: str, ckpt: Path, label: str, message: str) -> None:
    code, _, err = run(capsys, "create", "orders", "--store", store, "--checkpoint", str(ckpt), "--label", label)
    assert code == 2 and message in err and tree(Path(store)) == {}


def test_labels_are_kept_as_written(capsys: pytest.CaptureFixture[str], store: str, ckpt: Path) -> None:
    """Markup and quotes are data: kept verbatim, shown as text (the page renders them inert too)."""
    label = "note=<script>alert('x')</script> \"quoted\" & more"
    code, created = run_json(capsys, "create", "orders", "--store", store, "--checkpoint", str(ckpt), "--label", label)
    assert code == 0 and created["labels"] == {"note": label.split("=", 1)[1]}
    code, out, _ = run(capsys, "list", "--store", store)
    assert code == 0 and "<script>alert('x')</script>" in out


BAD_NAMES = ["..", "a/b", "../../etc", "zürich", "", "x" * 10_000, ".hidden", "a b"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n[:12]))
def test_bad_job_names_and_snapshot_ids_write_nothing(
    capsys: pytest.CaptureFixture[str], store: str, ckpt: Path, tmp_path: Path, name: str
) -> None:
    code, _, err = run(capsys, "create", name, "--store", store, "--checkpoint", str(ckpt))
    assert code == 2 and "invalid job name" in err and len(err) < 400, err  # a 10 kB name is not echoed whole
    run(capsys, "create", "orders", "--store", store, "--checkpoint", str(ckpt))
    before = tree(tmp_path)
    for command in (["show"], ["verify"], ["delete"], ["pin"], ["restore", "--to", str(tmp_path / "target")]):
        code, _, err = run(capsys, *command, "orders", "--store", store, name)
        assert code == 2 and "invalid snapshot id" in err, (command, err)
        code, _, err = run(capsys, *command, name, "--store", store, "latest")
        assert code == 2 and "invalid job name" in err, (command, err)
    assert tree(tmp_path) == before


def test_a_malformed_jobs_file_names_the_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[defaults]\nstore = "s"\n\n[jobs.orders]\nversions.v1 = { application = "a.py" \n')
    code, _, err = run(capsys, "status", "--jobs", str(jobs))
    assert code == 2 and f"jobs file {jobs} is not valid TOML" in err and "line 5" in err, err
    jobs.write_text('[jobs."../escape"]\nversions.v1 = { application = "a.py" }\n')
    code, _, err = run(capsys, "status", "--jobs", str(jobs))
    assert code == 2 and "invalid job name '../escape'" in err, err


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["stop", "orders", "--timeout", "soon"], "--timeout"),
        (["stop", "orders", "--timeout", "0s"], "--timeout"),
        (["deploy", "orders", "--wait", "2 fortnights"], "--wait"),
        (["upgrade", "orders", "--version", "v2", "--catch-up-timeout", "1 hour 5 minutes"], "--catch-up-timeout"),
        (["upgrade", "orders", "--version", "v2", "--replay-margin=-5s"], "--replay-margin"),
    ],
)
def test_time_flags_take_the_one_duration_grammar_and_name_the_flag_when_they_refuse(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], option: str
) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse's usage error: nothing is read or written
        main([*argv, "--jobs", str(tmp_path / "jobs.toml")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument {option}: {option} = " in err and '"2 days"' in err, err
    assert tree(tmp_path) == {}


def test_time_flags_take_words_and_plain_seconds(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from airflow_plugin.cli.parser import build_parser

    parser = build_parser()
    assert parser.parse_args(["stop", "orders", "--timeout", "5 minutes"]).timeout == 300.0
    assert parser.parse_args(["stop", "orders", "--timeout", "90"]).timeout == 90.0  # a plain number: seconds
    assert parser.parse_args(["deploy", "orders", "--wait", "0"]).wait == 0.0  # 0: do not wait, as before
    assert parser.parse_args(["deploy", "orders", "--wait", "1h"]).wait == 3600.0
    upgrade = parser.parse_args(["upgrade", "orders", "--version", "v2", "--catch-up-timeout", "1 hour"])
    assert (upgrade.catch_up_timeout, upgrade.replay_margin) == (3600.0, 60.0)  # the default margin stays
    assert parser.parse_args(["upgrade", "o", "--version", "v", "--replay-margin", "2 min"]).replay_margin == 120.0


def test_module_entry_point_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "airflow_plugin", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and "exit codes" in result.stdout.lower() and "restore" in result.stdout


def test_deploy_passes_partitions_on_to_the_rescale(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ckpt: Path
) -> None:
    """`deploy --partitions` reaches the engine: a snapshot of HDFS-backed state cannot be repartitioned by
    Spark, so the deploy is refused before anything is written or launched."""
    from tests.support.jobs import write_jobs

    jobs = str(write_jobs(tmp_path))
    code, created = run_json(capsys, "create", "orders", "--jobs", jobs, "--checkpoint", str(ckpt))
    assert code == 0
    before = tree(tmp_path)
    code, _, err = run(capsys, "deploy", "orders", "--jobs", jobs, "--restore", created["id"], "--partitions", "6")
    assert code == 4 and "which Spark's offline repartition does not support" in err, err
    assert tree(tmp_path) == before
    code, _, err = run(capsys, "deploy", "orders", "--jobs", jobs, "--restore", created["id"], "--partitions", "0")
    assert code == 2 and "cannot deploy with 0 state partitions" in err, err
    assert tree(tmp_path) == before


def test_leases_are_listed_shown_in_status_and_broken(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from airflow_plugin.core.lease import acquire, read_lease
    from airflow_plugin.core.storage import open_storage
    from tests.support.jobs import write_jobs

    jobs = str(write_jobs(tmp_path))
    store = open_storage(str(tmp_path / "store"))
    acquire(store, "orders", "ghost@elsewhere:4242", "deploy", ttl=600).keep()  # its holder died, say
    code, listed = run_json(capsys, "lease", "list", "--jobs", jobs)
    assert code == 0 and [(r["job"], r["holder"], r["operation"]) for r in listed] == [
        ("orders", "ghost@elsewhere:4242", "deploy")
    ]
    code, out, _ = run(capsys, "status", "--jobs", jobs)
    assert code == 0 and "lease: job orders is held by ghost@elsewhere:4242 for deploy" in out
    code, _, err = run(capsys, "stop", "orders", "--jobs", jobs)
    assert code == 4 and "job orders is busy: ghost@elsewhere:4242 for deploy" in err
    assert "`savepoints lease break orders`" in err
    code, _, err = run(capsys, "lease", "break", "--jobs", jobs)
    assert code == 2 and "name the job" in err
    code, out, _ = run(capsys, "lease", "break", "orders", "--jobs", jobs)
    assert code == 0 and "broke ghost@elsewhere:4242" in out and read_lease(store, "orders") is None
    code, _, err = run(capsys, "lease", "break", "orders", "--jobs", jobs)
    assert code == 3 and "has no lease" in err


def test_progress_stages_are_drawn_on_a_terminal_and_nothing_otherwise() -> None:
    """What `savepoints deploy` shows while it waits (the engine reports stages: launch, Spark session, first
    batch): on a terminal a spinner line with the stage and the seconds waited, cleared at the end; piped,
    nothing (the command's output stays the deployment id)."""
    import io

    from rich.console import Console

    from airflow_plugin.cli.render import BarProgress

    terminal = io.StringIO()
    progress = BarProgress(Console(file=terminal, force_terminal=True, width=160))
    progress.stage("deployment dp-1: the driver runs, creating its Spark session")
    progress.stage("deployment dp-1: Spark session local-1 up; waiting for the first batch")
    progress.finish()
    drawn = terminal.getvalue()
    assert "deployment dp-1: Spark session local-1 up; waiting for the first batch (0s)" in drawn
    assert drawn.rstrip().endswith("\x1b[2K"), "the spinner line is not cleared at the end"

    piped = io.StringIO()
    progress = BarProgress(Console(file=piped, force_terminal=False))
    progress.stage("deployment dp-1: the driver runs, creating its Spark session")
    progress.finish()
    assert piped.getvalue() == ""


def test_inspect_and_diff_print_what_the_engine_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The commands' wiring and text (the engine, which runs Spark, is stood in: tests/core/test_inspect.py runs
    it): the arguments reach it, the report prints, and a state Spark could not read is exit code 8."""
    from airflow_plugin.cli.commands import observe

    calls: list[tuple] = []
    op = {"operator": 0, "name": "stateStoreSave", "store": "default", "key_schema": "struct<user:string>"}
    inspected = {
        "snapshot": {"id": "sp-1", "batch_id": 4},
        "problems": [],
        "operators": [
            op
            | {"value_schema": "struct<cnt:bigint>", "rows": 9, "partitions": 3, "operator_bytes": 2048}
            | {"skew": {"ratio": 1.5, "largest": [[2, 5]]}, "oldest_window_start": "2026-01-01 00:00:00"}
            | {"oldest_key": '{"user":"u1"}', "sample": [{"partition_id": 2, "key": '{"user":"u1"}', "value": "{}"}]}
            | {"matches": []}
        ],
    }
    changed = {"added": 1, "removed": 0, "changed": 2, "rows_a": 8, "rows_b": 9, "bytes_a": 80, "bytes_b": 95}
    changed |= {"bytes_added": 10, "bytes_removed": 0, "operator_bytes_a": 1000, "operator_bytes_b": 2048}
    changed |= {"growth_by": "numeric value fields", "grew_most": [{"key": "u1", "growth": 3.0, "before": ["1"]}]}
    changed["grew_most"][0]["after"] = ["4"]
    diffed = {"a": {"id": "sp-1", "batch_id": 4}, "b": {"id": "sp-2", "batch_id": 6}, "problems": ["x unreadable"]}
    diffed["operators"] = [op | changed]

    def fake(report: dict) -> object:
        return lambda store, job, *ids, **options: calls.append((job, ids, sorted(options))) or report

    monkeypatch.setattr(observe, "inspect_snapshot", fake(inspected))
    monkeypatch.setattr(observe, "diff_snapshots", fake(diffed))
    store = str(tmp_path / "store")
    code, out, _ = run(capsys, "inspect", "j", "--store", store, "latest", "--key", "user=u1")
    assert code == 0 and "rows: 9 in 3 partitions (largest 2: 5; largest/mean 1.5)" in out
    assert "oldest window: starts 2026-01-01 00:00:00" in out and "key 'user=u1': 0 row(s)" in out
    code, out, err = run(capsys, "diff", "j", "--store", store, "sp-1", "sp-2", "--top", "3")
    assert code == 8 and "keys: 1 added, 0 removed, 2 changed; rows 8 -> 9" in out and "u1: +3" in out
    assert "1 state(s) could not be read" in err
    assert calls == [
        ("j", ("latest",), ["concurrency", "key", "sample", "spark_conf"]),
        ("j", ("sp-1", "sp-2"), ["concurrency", "spark_conf", "top"]),
    ]
