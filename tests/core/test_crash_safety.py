"""`create` killed with SIGKILL at random points never leaves a COMPLETED snapshot that fails verify,
and the next create succeeds. Real processes: the CLI in a child process, the moto server as store. The
store packs small files into packs of 256 bytes: a create writes hundreds of packs, so kills land
between them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from airflow_plugin.core.records.manifest import SnapshotStatus
from airflow_plugin.core.snapshots.blobs import PackSettings
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import open_storage
from devtools.forked import wait_for
from tests.support.synthetic import write_checkpoint


def start_create(store: str, ckpt: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "airflow_plugin",
        "create",
        "orders",
        "--store",
        store,
        "--checkpoint",
        str(ckpt),
        "--concurrency",
        "4",
        "--json",
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())


def test_sigkill_at_random_points_never_leaves_a_broken_completed_snapshot(tmp_path: Path, s3_store: str) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=40, partitions=32)  # ~1,400 files
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(target_size=256))
    rng = random.Random(20261121)
    killed_mid_copy = 0
    for round_no in range(6):
        before = {m.id for m in store.list("orders")}
        process = start_create(s3_store, ckpt)
        if round_no % 2:  # anywhere from start-up on
            time.sleep(rng.uniform(0.2, 2.0))
        else:  # somewhere inside the copy, once the IN_PROGRESS manifest is there

            def started(before: set[str] = before, process: subprocess.Popen[bytes] = process) -> bool:
                return any(m.id not in before for m in store.list("orders")) or process.poll() is not None

            assert wait_for(started)
            time.sleep(rng.uniform(0.0, 0.4))
        process.send_signal(signal.SIGKILL)
        process.wait()
        new = [m for m in store.list("orders") if m.id not in before]
        killed_mid_copy += any(m.status is SnapshotStatus.IN_PROGRESS for m in new)
        for manifest in store.list("orders"):
            if manifest.status is SnapshotStatus.COMPLETED:
                assert verify_snapshot(store, "orders", manifest.id).ok, manifest.id

    assert killed_mid_copy >= 2, "the kills should have hit snapshots in the middle of their copy"
    process = start_create(s3_store, ckpt)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()
    latest = store.latest("orders")
    assert latest.status is SnapshotStatus.COMPLETED and latest.batch_id == 39
    assert verify_snapshot(store, "orders", latest.id).ok
    assert len({f.key for f in latest.files}) > 50  # packed: many files a pack, many packs
