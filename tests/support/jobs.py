"""A small jobs file for tests that need declared jobs but no Spark."""

from __future__ import annotations

from pathlib import Path


def write_jobs(tmp_path: Path, application: str = "job.py", extra: str = "", *, touch: bool = True) -> Path:
    """Declares job `orders` (v1, v2) running `application`, which is created empty unless `touch` is off or
    it exists: deploys get as far as spark-submit."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if touch and not (tmp_path / application).exists():
        (tmp_path / application).touch()
    path = tmp_path / "jobs.toml"
    path.write_text(
        f"""
[defaults]
store = "store"
checkpoint_root = "checkpoints"
log_dir = "logs"

[jobs.orders]
trigger_interval = "1 second"
delivery = "exactly-once"
args = ["--input", "in", "--output", "out"]
conf = {{ "spark.sql.shuffle.partitions" = "3" }}
versions.v1 = {{ application = "{application}" }}
versions.v2 = {{ application = "{application}", args = ["--variant", "2"] }}
{extra}
"""
    )
    return path
