"""The file sink's own log, outside the checkpoint: `<output>/_spark_metadata/<batch>` lists the data files
each batch committed, and every `compactInterval` batches (10) `<batch>.compact` holds all entries up to
it (Spark later deletes the batch files it replaces). Each entry is JSON with the data file's absolute
URI and an action (`add`, `delete`). Spark skips a batch whose id is in this log: that is the sink's
exactly-once.

Here: read the log (position, the files committed up to a batch), keep its state at a snapshot's batch N
(`log_at`: the newest compact up to N and the batch files after it, copied into the snapshot), and REWIND
the sink to N: the log files after N and the data files they added are moved, never deleted, into
`<output>/_savepoints_quarantine/<rewind id>/` (a directory Spark's readers skip, like every name starting
with '_'), and the log is put back as it was at N. A restored query then runs those batches again with the
same offsets and writes their records once more. `rewind.json` in the quarantine lists every move, so a
rewind can be undone by hand (docs/operations.md) and one interrupted half-way is finished by the next."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlparse

from ..compactible_log import complete_at, entries, log_id, needed_for
from ..errors import Refused
from ..storage import ObjectInfo, Storage, spark_uri

LOG_DIR = "_spark_metadata/"
QUARANTINE = "_savepoints_quarantine/"


def log_files(output: Storage) -> dict[str, ObjectInfo]:
    """The sink's log files by name (`7`, `9.compact`), in batch order; temporary files left out."""
    found = {}
    for info in output.list(LOG_DIR):
        name = info.key[len(LOG_DIR) :]
        if "/" not in name and log_id(name) is not None:
            found[name] = info
    return dict(sorted(found.items(), key=lambda item: log_id(item[0]) or (0, False)))


def position(output: Storage) -> int | None:
    """The last batch id the file sink at `output` committed, or None if it committed none."""
    batches = [b[0] for name in log_files(output) if (b := log_id(name))]
    return max(batches) if batches else None


def log_at(output: Storage, batch_id: int) -> list[ObjectInfo]:
    """The log files a snapshot at `batch_id` keeps, to rewind the sink to it later."""
    files = log_files(output)
    return [files[name] for name in needed_for(files, batch_id)]


def committed(contents: Iterable[bytes]) -> list[str]:
    """The data file URIs committed by these log files (read in batch order), `delete` entries applied."""
    files: dict[str, None] = {}
    for raw in contents:
        for entry in entries(raw):
            if entry.get("action", "add") == "delete":
                files.pop(entry["path"], None)
            else:
                files[entry["path"]] = None
    return list(files)


def key_of(output: Storage, uri: str) -> str:
    """A data file's key below the sink root, from the absolute URI in the log."""
    root = spark_uri(output).rstrip("/")
    parsed, base = urlparse(uri), urlparse(root)
    path = unquote(parsed.path)
    if parsed.scheme in ("s3", "s3a") and base.scheme == "s3a" and parsed.netloc == base.netloc:
        prefix = base.path.strip("/")
        relative = path.lstrip("/")[len(prefix) :].lstrip("/") if path.lstrip("/").startswith(prefix) else None
    elif parsed.scheme in ("file", "") and base.scheme == "file":
        relative = os.path.relpath(path, base.path) if path.startswith(base.path.rstrip("/") + "/") else None
    else:
        relative = None
    if relative is None:
        raise Refused(
            f"the file sink log of {output.uri} names {uri}, which is not below the sink: a sink moved since it "
            "was written cannot be rewound automatically; restore a newer snapshot instead"
        )
    return relative


@dataclass
class Rewind:
    """Moving a file sink back to batch `batch_id` (a plan: nothing happens until `execute`)."""

    location: str
    batch_id: int
    position: int  # the sink's last committed batch now
    restore_log: dict[str, str]  # log files as they were at batch_id (name -> content), written back
    drop_log: list[str]  # log files of later batches, moved to the quarantine
    data: list[str]  # keys of the data files those batches added, moved to the quarantine
    quarantine: str = ""  # prefix below the sink, set when planned
    moved: list[list[str]] = field(default_factory=list)  # [from, to] keys, filled while executing

    def describe(self) -> dict[str, Any]:
        return {
            "sink": self.location,
            "rewound_to_batch": self.batch_id,
            "batches_rewound": f"{self.batch_id + 1}..{self.position}",
            "log_files_moved": len(self.drop_log),
            "data_files_moved": len(self.data),
            "quarantine": f"{self.location.rstrip('/')}/{self.quarantine}",
        }


def plan_rewind(output: Storage, saved: Mapping[str, bytes] | None, batch_id: int, snapshot_id: str) -> Rewind:
    """What rewinding the sink at `output` to `batch_id` moves. `saved`: the log files a snapshot kept
    (`log_at`); without them the sink's own log must still hold everything up to `batch_id`."""
    current_files = log_files(output)
    current = {name: output.read(info.key) for name, info in current_files.items()}
    if saved is None or not complete_at(saved, batch_id):
        if not complete_at(current, batch_id):
            raise Refused(
                f"the file sink {output.uri} cannot be rewound to batch {batch_id}: its log was compacted past it "
                "and the snapshot holds no copy of the log (taken before sinks were recorded); restore a newer "
                "snapshot, or write the restored query to a fresh output path"
            )
        saved = {name: current[name] for name in needed_for(current, batch_id)}
    at_n = {name: bytes(saved[name]) for name in needed_for(saved, batch_id)}
    now = position(output)
    added_since = set(committed(current[n] for n in needed_for(current, now if now is not None else -1)))
    added_since -= set(committed(at_n.values()))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return Rewind(
        location=output.uri,
        batch_id=batch_id,
        position=now if now is not None else batch_id,
        restore_log={name: data.decode("utf-8") for name, data in at_n.items() if current.get(name) != data},
        drop_log=[name for name in current if (b := log_id(name)) is not None and b[0] > batch_id],
        data=sorted(key_of(output, uri) for uri in added_since),
        quarantine=f"{QUARANTINE}{stamp}-{snapshot_id}/",
    )


def _crc(key: str) -> str:
    """Hadoop's local file system keeps a checksum `.<name>.crc` beside each file it writes."""
    directory, _, name = key.rpartition("/")
    return f"{directory}/.{name}.crc" if directory else f".{name}.crc"


def _move(output: Storage, key: str, to: str) -> bool:
    """Move one object within the sink (a rename where the sink is local, with its Hadoop checksum, which
    would otherwise block Spark from writing that name again). False if it is already gone."""
    source, target = output.local_path(key), output.local_path(to)
    if source is not None and target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(source, target)
        except FileNotFoundError:
            return False
        checksum, checksum_to = output.local_path(_crc(key)), output.local_path(_crc(to))
        if checksum is not None and checksum_to is not None and checksum.exists():
            os.replace(checksum, checksum_to)
        return True
    try:
        with output.fetched(key) as local:
            output.upload(local, to)
    except FileNotFoundError:
        return False
    output.delete([key])
    return True


def execute(output: Storage, rewind: Rewind) -> Rewind:
    """Carry out the rewind. The plan is written first; the log is put back to batch N before data files
    move (from then on the moved batches are no longer committed: Spark's readers follow the log), and
    every step may be repeated, so an interrupted rewind is finished by running it again."""
    record = rewind.quarantine + "rewind.json"

    def save(state: str) -> None:
        output.write(record, json.dumps({**asdict(rewind), "state": state}, indent=1).encode())

    save("started")
    for name in rewind.drop_log:
        if _move(output, LOG_DIR + name, rewind.quarantine + LOG_DIR + name):
            rewind.moved.append([LOG_DIR + name, rewind.quarantine + LOG_DIR + name])
    for name, content in rewind.restore_log.items():
        output.delete([_crc(LOG_DIR + name)])  # a stale local checksum would fail Spark's read of the file
        output.write(LOG_DIR + name, content.encode("utf-8"))
    for key in rewind.data:
        target = rewind.quarantine + "data/" + key
        if _move(output, key, target):
            rewind.moved.append([key, target])
    save("done")
    return rewind


def unfinished(output: Storage) -> list[Rewind]:
    """Rewinds that were interrupted before they were done (their record says `started`)."""
    found = []
    for info in output.list(QUARANTINE):
        if info.key.endswith("/rewind.json"):
            data = json.loads(output.read(info.key))
            if data.pop("state", "") == "started":
                found.append(Rewind(**data))
    return found
