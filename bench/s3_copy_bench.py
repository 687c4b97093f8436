"""A snapshot of a checkpoint on S3 into a store on the same S3, against `aws s3 sync` s3 -> s3 of the same
prefix, in one run, with the bytes that passed through each client counted.

    uv run python -m bench.s3_copy_bench      (`make bench-s3`)

The checkpoint is the snapshot bench's RocksDB one (8 partitions, 117 batches; built once by
bench.snapshot_bench and reused), put on the moto server with a SHA-256 on each object, as S3A writes it
with the conf the engine gives a job whose checkpoint_root is on s3a://. Every request of both clients
goes through devtools/faulty_s3.py with no faults, which counts the body bytes each way. The peer copies
every object with CopyObject (no bytes through it); the engine copies the files above the store's pack
threshold within S3 and reads the smaller ones to pack them: measured at the default threshold (1 MiB) and
at 64 KiB. Best of 2 each, interleaved. Goals (issue 16): time <= 0.2x the peer, client bytes <= 1% of
the bytes copied. Writes .bench/s3_copy.json."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from airflow_plugin.core.records.manifest import Manifest
from airflow_plugin.core.snapshots.blobs import MiB, PackSettings
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from bench.report import Results, Target, log, report
from bench.snapshot_bench import BENCH_DIR, CASES, ensure_checkpoint, mb, run_tool, s3_server, tree_stats, venv_tool
from devtools.faulty_s3 import FaultyS3

RESULTS = BENCH_DIR / "s3_copy.json"
BUCKET = "bench-s3copy"
REPEATS = 2
TIME_TARGET = 0.2  # snapshot time / aws s3 sync time
BYTES_TARGET = 0.01  # client bytes / bytes copied
THRESHOLDS = {"default 1 MiB": 1 * MiB, "64 KiB": 64 * 1024, "0 (no packs)": 0}


def upload_with_checksums(proxy: FaultyS3, checkpoint: Path, prefix: str) -> None:
    """Put every file on S3 with a SHA-256, as S3A does with `fs.s3a.create.checksum.algorithm=SHA256`."""
    target = proxy.storage(BUCKET, prefix)
    files = [p for p in checkpoint.rglob("*") if p.is_file()]

    def put(path: Path) -> None:
        key = f"{prefix}/{path.relative_to(checkpoint)}"
        target.client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes(), ChecksumAlgorithm="SHA256")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files))


def main() -> None:
    results = Results()
    case = next(c for c in CASES if c.slug == "rocksdb")
    checkpoint = ensure_checkpoint(case, results)
    files, size = tree_stats(checkpoint)
    with s3_server() as server, FaultyS3(server.endpoint) as proxy:
        os.environ.update(server.env)
        server.create_bucket(BUCKET)
        log(f"putting the checkpoint on S3 with SHA-256 checksums ({files} files, {mb(size)} MB)")
        upload_with_checksums(proxy, checkpoint, "checkpoint")
        source = proxy.storage(BUCKET, "checkpoint")
        proxy.reset_counts()
        listed = sum(1 for _ in source.list())
        listing = proxy.reset_counts()["bytes_down"]  # what one listing of the checkpoint costs any client
        peer: list[tuple[float, dict[str, int]]] = []
        ours: dict[str, list[tuple[float, dict[str, int], Manifest]]] = {name: [] for name in THRESHOLDS}
        for rep in range(REPEATS):
            log(f"peer: aws s3 sync s3 -> s3 ({rep + 1}/{REPEATS})")
            sync = [venv_tool("aws"), "--endpoint-url", proxy.endpoint, "s3", "sync", f"s3://{BUCKET}/checkpoint/"]
            sync += [f"s3://{BUCKET}/peer-{rep}/", "--only-show-errors", "--no-progress"]
            proxy.reset_counts()
            seconds = run_tool(sync, {**server.env, "AWS_ENDPOINT_URL": proxy.endpoint}, "aws s3 sync")
            peer.append((seconds, proxy.reset_counts()))
            for name, threshold in THRESHOLDS.items():
                log(f"engine: snapshot, pack threshold {name} ({rep + 1}/{REPEATS})")
                store = SnapshotStore(proxy.storage(BUCKET, f"store-{threshold}-{rep}"))
                store.blobs.init_format(PackSettings(threshold=threshold))
                proxy.reset_counts()
                started = time.monotonic()
                manifest = create_snapshot(store, source, SnapshotRequest(job="s3copy"))
                ours[name].append((time.monotonic() - started, proxy.reset_counts(), manifest))

    peer_s, peer_counts = min(peer, key=lambda run: run[0])
    peer_bytes = peer_counts["bytes_up"] + peer_counts["bytes_down"]
    results.row("checkpoint", "on S3", f"{files} files, {mb(size)} MB ({case.slug}: RocksDB + changelog, 8 partitions)")
    results.row(
        "peer",
        "aws s3 sync s3 -> s3",
        f"{peer_s:.2f} s, {peer_counts['requests']} requests, {mb(peer_bytes)} MB through the client",
    )
    results.row("checkpoint", "one listing of it", f"{listed} objects: {mb(listing)} MB of XML through a client")
    data: dict[str, object] = {"files": files, "bytes": size, "peer_s": round(peer_s, 3), "peer_bytes": peer_bytes}
    data["listing_bytes"] = listing
    for name, runs in ours.items():
        seconds, counts, manifest = min(runs, key=lambda run: run[0])
        through = counts["bytes_up"] + counts["bytes_down"]
        share = through / manifest.total_bytes
        ratio = seconds / peer_s
        detail = (
            f"{seconds:.2f} s = {ratio:.2f}x, {counts['requests']} requests, {mb(through)} MB through the client "
            f"= {share:.1%} of the {mb(manifest.total_bytes)} MB copied ({mb(through - listing)} MB without the "
            f"listing = {(through - listing) / manifest.total_bytes:.1%})"
        )
        results.row("engine", f"snapshot, pack threshold {name}", detail)
        results.targets.append(Target(f"time / aws s3 sync ({name})", ratio, TIME_TARGET, "x"))
        results.targets.append(Target(f"client bytes / bytes copied ({name})", share, BYTES_TARGET, ""))
        data[name] = {"seconds": round(seconds, 3), "requests": counts["requests"], "client_bytes": through}
    results.data = data
    report(results, RESULTS)


if __name__ == "__main__":
    main()
