"""One snapshot in a fresh process, reporting its own time and peak memory as a JSON line.

    python -m bench.memory_probe <checkpoint dir> <store uri>

Peak RSS is read from /proc/self/status (VmHWM) where available, else from getrusage; the parent also
reads the child's ru_maxrss through wait4, so both views are reported.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage


def rss_mb(field: str) -> float:
    """VmRSS / VmHWM of this process in MB (falls back to ru_maxrss without /proc)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    checkpoint, store_uri = sys.argv[1], sys.argv[2]
    baseline = rss_mb("VmRSS")
    started = time.monotonic()
    manifest = create_snapshot(
        SnapshotStore(open_storage(store_uri)), open_storage(checkpoint), SnapshotRequest(job="synthetic")
    )
    seconds = time.monotonic() - started
    result = {
        "seconds": round(seconds, 3),
        "files": len(manifest.files),
        "total_bytes": manifest.total_bytes,
        "uploaded_files": manifest.uploaded_files,
        "timings": manifest.timings,
        "baseline_rss_mb": round(baseline, 1),
        "peak_rss_mb": round(rss_mb("VmHWM"), 1),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
