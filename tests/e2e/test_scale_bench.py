"""`make bench-scale` cannot rot: its every step but those that start Spark applications of their own (deep verify,
the pre-flight, the upgrade: their own tests run them) runs on a few MB, on the same disk-backed S3 server, with
the same job, peers and report (bench/scale_bench.py --smoke). Nothing here is timed: the figures a bench prints
at this size mean nothing; what is checked is that each step ran and measured what it says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow(seconds=120)
def test_the_scale_bench_runs_every_step_on_a_few_megabytes(tmp_path: Path) -> None:
    results = tmp_path / "scale.json"
    command = [sys.executable, "-m", "bench.scale_bench", "--smoke", "--work", str(tmp_path / "run")]
    finished = subprocess.run(
        [*command, "--results", str(results)], cwd=ROOT, capture_output=True, text=True, timeout=540, check=False
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    report = json.loads(results.read_text())

    assert report["server"].startswith("S3Proxy ")
    assert report["state_bytes"] > 1_000_000, "the job's RocksDB state grew to megabytes"
    assert report["peers"]["files"] > 0 and report["peers"]["s5cmd_requests"] > 0 and report["peers"]["aws_requests"]
    first, second = report["first"], report["second"]
    assert first["counts"]["requests"] > 0 and first["counts"]["bytes_up"] > 0, "the proxy counted the savepoint"
    assert second["counts"]["requests"] > 0
    assert report["restore_s"] > 0 and report["s5cmd_download_s"] > 0 and report["verify_s"] > 0
    assert report["prune_s"] > 0
    assert 0 < report["peaks_mb"]["savepoints"] < 512 and report["peaks_mb"]["driver"] > 0
    names = {target["name"]: target for target in report["targets"]}
    assert len(names) == 6
    # a second savepoint after 1% new keys stores what is new, not the state again
    assert names["second savepoint's bytes / first's"]["measured"] < 0.5
    assert "targets met" in finished.stdout, "the report was printed"
