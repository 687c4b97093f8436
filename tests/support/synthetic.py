"""Synthetic checkpoints with Spark's on-disk layout (HDFS-backed state), for fast engine tests that
need no JVM. Real checkpoints of every kind come from spark_kinds.py."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_plugin.core.lease import LeaseRecord

QUERY_ID = "6f1c1a52-3f5e-4a7e-9a52-0f6f3b2c1d11"


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def write_checkpoint(
    root: Path, batches: int, *, partitions: int = 2, pending: bool = False, provider: str | None = None
) -> Path:
    """Batches 0..batches-1 committed; `pending` adds offsets/<batches> without a commit; `provider`: the state
    store provider each offset log entry pins (ROCKSDB; none: Spark's default, HDFS-backed)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    for directory in ("offsets", "commits", "sources/0", "state/0/_metadata"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "sources/0/0").write_text('v1\n{"path":"/in"}')
    (root / "state/0/_metadata/metadata").write_text(
        'v1\n{"operatorInfo":{"operatorId":0,"operatorName":"stateStoreSave"},'
        f'"stateStoreInfo":[{{"storeName":"default","numColsPrefixKey":0,"numPartitions":{partitions}}}]}}'
    )
    for p in range(partitions):
        (root / f"state/0/{p}/_metadata").mkdir(parents=True, exist_ok=True)
        (root / f"state/0/{p}/_metadata/schema").write_text("schema")
    for batch in range(batches + (1 if pending else 0)):
        add_batch(root, batch, partitions=partitions, commit=batch < batches, provider=provider)
    return root


def add_batch(root: Path, batch: int, *, partitions: int = 2, commit: bool = True, provider: str | None = None) -> None:
    conf = {"spark.sql.shuffle.partitions": str(partitions)}
    if provider:
        conf["spark.sql.streaming.stateStore.providerClass"] = provider
    (root / f"offsets/{batch}").write_text(
        "v1\n"
        + json.dumps({"batchWatermarkMs": batch * 1000, "batchTimestampMs": 1_700_000_000_000 + batch, "conf": conf})
        + f"\n{batch * 10}"
    )
    for p in range(partitions):
        # batch b commits state version b+1
        (root / f"state/0/{p}/{batch + 1}.delta").write_bytes(f"delta {batch} {p}".encode() * 10)
    if commit:
        (root / f"commits/{batch}").write_text('v1\n{"nextBatchWatermarkMs":0}')


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root, by relative path: to assert that nothing changed. A job's released lease record
    (what a lease taken and given back leaves, core/lease.py) reads as no lease, as it does to the engine."""
    if not root.exists():
        return {}
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    return {key: data for key, data in files.items() if not _released_lease(key, data)}


def _released_lease(key: str, data: bytes) -> bool:
    parts = key.split("/")
    return len(parts) >= 3 and parts[-1] == "lease.json" and data == LeaseRecord.released(parts[-2]).to_json()


def kafka_offsets(root: Path, batch: int, offsets: dict[str, dict[int, int]], *, version: int = 1) -> None:
    """Rewrite offsets/<batch> of a synthetic checkpoint as a Kafka source's: next offset per topic and partition,
    in offset log `version` 1 (positional) or 2 (`<source id>:<offset>`)."""
    line = json.dumps({topic: {str(p): o for p, o in parts.items()} for topic, parts in offsets.items()})
    meta = json.loads((root / f"offsets/{batch}").read_text().splitlines()[1])
    (root / f"offsets/{batch}").write_text(f"v{version}\n{json.dumps(meta)}\n{'0:' if version >= 2 else ''}{line}")
