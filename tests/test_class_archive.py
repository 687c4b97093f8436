"""The tests' spark-submit JVMs map the class archive (devtools/class_archive.py), and one that does not fit is
refused by the JVM, which then starts as it would have."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devtools import class_archive
from devtools.java import java_executable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.spark
def test_the_sessions_jvm_maps_the_class_archive(spark: SparkSession) -> None:
    archive = class_archive.archive_path()
    assert str(archive) in os.environ.get("SPARK_SUBMIT_OPTS", ""), "tests/conftest.py sets SPARK_SUBMIT_OPTS"
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    mapped = Path(f"/proc/{pid}/maps").read_text()
    assert str(archive) in mapped, f"the session's JVM ({pid}) refused {archive}: run it with -Xlog:cds to see why"


def test_the_archive_is_another_when_a_jar_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jars").mkdir()
    jar = tmp_path / "jars" / "spark-core_2.13-4.2.0.jar"
    jar.write_bytes(b"one")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    before = class_archive.archive_path()
    assert before.parent == class_archive.ARCHIVE_DIR
    os.utime(jar, ns=(0, 0))  # same bytes, another time: a JVM would refuse the archive made before
    assert class_archive.archive_path() != before


def test_a_jvm_refuses_an_archive_that_does_not_fit_and_runs(tmp_path: Path) -> None:
    java = java_executable()
    assert java is not None
    misfit = tmp_path / "other.jsa"
    misfit.write_bytes(b"not an archive")
    result = subprocess.run(
        [java, f"-XX:SharedArchiveFile={misfit}", *class_archive.QUIET.split(), "-version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr


def test_a_failed_build_leaves_no_archive_and_keeps_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    submit = home / "bin" / "spark-submit"
    submit.write_text("#!/bin/sh\necho 'Error: no driver here' >&2\nexit 3\n")
    submit.chmod(0o755)
    monkeypatch.setenv("SPARK_HOME", str(home))
    archives = tmp_path / "archives"
    archives.mkdir()
    before = archives / "spark-driver-0000000000000000.jsa"
    before.write_bytes(b"the archive made before")
    with pytest.raises(class_archive.ClassArchiveError, match=r"exited 3 \(class_archive_app.py\):\nError: no driver"):
        class_archive.build(archives / "spark-driver-1111111111111111.jsa")
    assert [p.name for p in archives.iterdir()] == [before.name]
    assert before.read_bytes() == b"the archive made before"


def test_a_session_waits_for_the_archive_while_its_maker_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py's session JVM starts once the archive is whole, or once its maker ended without one (a
    zombie its parent has not reaped yet counts as ended)."""
    archive = tmp_path / "spark-driver-0000000000000000.jsa"
    monkeypatch.setattr(class_archive, "archive_path", lambda: archive)
    maker = subprocess.Popen(["sh", "-c", f"sleep 0.3; touch {archive}; exec sleep 60"])
    try:
        monkeypatch.setenv(class_archive.BUILDER_ENV, str(maker.pid))
        class_archive.wait_for_builder()
        assert archive.exists() and maker.poll() is None  # the archive, not the maker's end, ended the wait
    finally:
        maker.kill()
        maker.wait()

    archive.unlink()
    failing = subprocess.Popen(["sh", "-c", "sleep 0.3; exit 1"])
    monkeypatch.setenv(class_archive.BUILDER_ENV, str(failing.pid))
    class_archive.wait_for_builder()  # returns: the maker is a zombie, no archive will come
    assert not archive.exists() and failing.wait() == 1
