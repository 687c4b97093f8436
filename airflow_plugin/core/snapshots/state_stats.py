"""What a snapshot records of its state, so that a chart of state over time needs no Spark: per stateful
operator, the bytes of the files that hold its state at batch N (the checkpoint's own files, per partition),
the rows Spark's progress reported for it (a managed job's heartbeat carries the last batch's `stateOperators`),
and the skew of its partitions by size with the largest ones named. A state that grows without bound (a
missing watermark) shows as rows and bytes rising from one snapshot to the next; one hot key as skew.

`savepoints inspect` reads the state itself (rows per partition, keys, a sample) with Spark; this is what can
be known from the files and the progress alone."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from .checkpoint import store_of

LARGEST = 3  # partitions named as the largest


def skew(sizes: dict[int, int]) -> dict[str, Any]:
    """How unevenly `sizes` (partition -> bytes or rows) are spread: the largest against the mean (1.0: even),
    and the largest partitions."""
    if not sizes:
        return {"ratio": None, "largest": []}
    mean = sum(sizes.values()) / len(sizes)
    largest = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:LARGEST]
    return {
        "ratio": round(max(sizes.values()) / mean, 2) if mean else None,
        "mean": round(mean, 1),
        "largest": [[partition, size] for partition, size in largest],
    }


def state_stats(
    files: Iterable[tuple[str, int]], operators: list[dict[str, Any]], progress: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Per operator (`operators`: id and name from its metadata): `bytes` of its state files at N (`files`: the
    snapshot's (path, size)), `partitions`, `skew` by bytes, and from `progress` (Spark's, in operator order)
    `rows` and the batch they are of."""
    by_operator: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for path, size in files:
        store = store_of(path)
        if store is not None:
            by_operator[store.operator][store.partition] += size
    ids = sorted({*by_operator, *(op["id"] for op in operators)})
    names = {op["id"]: op.get("name") for op in operators}
    reported = list(progress or [])
    stats = []
    for index, operator in enumerate(ids):
        partitions = dict(by_operator.get(operator, {}))
        entry: dict[str, Any] = {
            "id": operator,
            "name": names.get(operator),
            "bytes": sum(partitions.values()),
            "partitions": len(partitions),
            "skew": skew(partitions),
            "rows": None,
        }
        if len(reported) == len(ids):  # Spark reports its stateful operators in the order of their ids
            entry["rows"] = reported[index].get("rows")
            entry["rows_batch_id"] = reported[index].get("batch_id")
            entry["name"] = entry["name"] or reported[index].get("name")
        stats.append(entry)
    return stats
