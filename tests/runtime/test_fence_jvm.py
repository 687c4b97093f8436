"""The driver's fence in the JVM (spark_jobs/runtime/jvm/savepoints/fence/Fence.java), run in a real JVM from the
jar every deployment's driver gets (core/spark_app.py `fence_jar`): what a commit may do before the first renewal,
while renewed, once lapsed, once superseded, and unarmed. Each case runs in a JVM of its own (the fence is a
driver's static state)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from airflow_plugin.core.spark_app import fence_jar

# `java File.java` compiles and runs one source file: a case, printing what each commit check did
CASE = """
import savepoints.fence.Fence;

public class Case {
  static String attempt() {
    try {
      Fence.check("a commit");
      return "written";
    } catch (java.io.IOException e) {
      return e.getMessage().startsWith("SAVEPOINTS_FENCED") ? "refused" : "other: " + e.getMessage();
    }
  }

  public static void main(String[] args) throws Exception {
    String which = args[0];
    long before = System.nanoTime();
    if (!which.equals("unarmed")) Fence.arm(0.3);  // a commit waits 0.3 s for a renewal, then fails
    if (which.equals("renewed")) Fence.renew(System.nanoTime(), 30.0);
    if (which.equals("lapsed")) Fence.renew(before - 2_000_000_000L, 1.0);  // a read that began 2 s ago
    if (which.equals("superseded")) { Fence.renew(System.nanoTime(), 30.0); Fence.supersede("left out"); }
    if (which.equals("renewed-late")) {
      new Thread(() -> { sleep(100); Fence.renew(System.nanoTime(), 30.0); }).start();
    }
    System.out.println(attempt() + " " + Fence.valid());
  }

  static void sleep(long ms) { try { Thread.sleep(ms); } catch (InterruptedException e) { } }
}
"""


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("java") is None:
        pytest.fail("java is missing: Spark needs Java 17")
    source = tmp_path_factory.mktemp("fence") / "Case.java"
    source.write_text(CASE)
    return fence_jar(), source


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("unarmed", "written true"),  # a pre-flight, a standby's warm-up, a Spark tool: nothing is checked
        ("armed", "refused false"),  # armed, never renewed: no commit until the first read of the record
        ("renewed", "written true"),
        ("renewed-late", "written true"),  # the commit waits for the renewal that comes while it waits
        ("lapsed", "refused false"),  # the read that renewed it began longer ago than the interval
        ("superseded", "refused false"),
    ],
)
def test_a_commit_passes_the_fence_only_while_renewed_and_not_superseded(
    case: tuple[Path, Path], which: str, expected: str
) -> None:
    jar, source = case
    done = subprocess.run(
        ["java", "-cp", str(jar), str(source), which], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected, done.stdout + done.stderr
