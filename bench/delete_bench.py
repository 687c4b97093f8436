"""Delete benchmark: a 20,000-object prefix deleted through the engine (list, then DeleteObjects batches of
1000 keys, 8 in parallel: what `prune` uses for retired checkpoint locations and blobs) vs.
`aws s3 rm --recursive`, on ONE moto server (bench/s3_server.py, its own process), in one run.

    uv run python -m bench.delete_bench [--objects 20000]

Each measurement gets a freshly populated prefix (parallel put_object, 32 threads; not timed). Target:
the engine takes at most 1/5 of awscli's time. Results go to .bench/delete_results.json.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from airflow_plugin.core.storage import S3Storage, open_storage
from bench.report import Results, Target, log, report
from bench.snapshot_bench import S3Server, run_tool, s3_server, venv_tool

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / ".bench" / "delete_results.json"
BUCKET = "delete-bench"
TARGET_RATIO = 0.2  # engine time / awscli time: ">= 5x faster"


def populate(server: S3Server, prefix: str, count: int) -> None:
    """`count` small objects under `prefix`, spread over directories like a checkpoint's."""
    storage = open_storage(f"s3://{BUCKET}/{prefix}")
    assert isinstance(storage, S3Storage)
    client = storage.client

    def put(n: int) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/state/0/{n % 200}/{n}.delta", Body=b"x" * 64)

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(put, range(count)))


def remaining(prefix: str) -> int:
    return sum(1 for _ in open_storage(f"s3://{BUCKET}/{prefix}").list())


def engine_delete(server: S3Server, prefix: str) -> float:
    """List the prefix and delete every key through `Storage.delete` (batched, parallel)."""
    storage = open_storage(f"s3://{BUCKET}/{prefix}")
    started = time.monotonic()
    storage.delete([info.key for info in storage.list()])
    return time.monotonic() - started


def awscli_delete(server: S3Server, prefix: str) -> float:
    command = [venv_tool("aws"), "--endpoint-url", server.endpoint, "s3", "rm", "--recursive"]
    command += [f"s3://{BUCKET}/{prefix}/", "--only-show-errors"]
    return run_tool(command, server.env, "aws s3 rm --recursive")


def measure(server: S3Server, name: str, objects: int, rounds: int, results: Results) -> float:
    delete = engine_delete if name == "engine" else awscli_delete
    times = []
    for rep in range(rounds):
        prefix = f"{name.split()[0]}-{rep}"  # "engine-0", "aws-0": no spaces in keys
        log(f"{name}: populating {objects} objects under s3://{BUCKET}/{prefix}/")
        populate(server, prefix, objects)
        with server.phase() as usage:
            seconds = delete(server, prefix)
        left = remaining(prefix)
        if left:
            raise RuntimeError(f"{name} left {left} of {objects} objects under {prefix}: the measurement is void")
        log(f"{name}: deleted {objects} objects in {seconds:.2f}s")
        detail = f"{seconds:.2f} s  {usage.describe(seconds, 0)}"
        results.row(name, f"delete {objects} objects (round {rep + 1})", detail)
        times.append(seconds)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=1, help="measurements per tool; the best counts")
    args = parser.parse_args()
    results = Results()
    with s3_server() as server:
        os.environ.update(server.env)  # the engine's boto3 talks to this server
        server.create_bucket(BUCKET)
        engine = measure(server, "engine", args.objects, args.rounds, results)
        aws = measure(server, "aws s3 rm --recursive", args.objects, args.rounds, results)
    ratio = engine / aws
    results.row("summary", "engine vs awscli", f"{aws / engine:.1f}x faster ({engine:.2f} s vs {aws:.2f} s)")
    results.data["delete"] = {"objects": args.objects, "engine_s": engine, "awscli_s": aws}
    results.targets.append(
        Target("delete prefix: engine / awscli time", ratio, TARGET_RATIO, "x", f"{args.objects} objects, >= 5x faster")
    )
    report(results, RESULTS)


if __name__ == "__main__":
    main()
