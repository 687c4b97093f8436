"""A Delta table as the sink. Delta's streaming sink commits each batch as one table version whose actions
include `{"txn": {"appId": <query id>, "version": <batch id>}}`, and skips a batch whose id is at or below
the newest txn of its query id: that is its exactly-once, and what a restore behind it runs into.

Here, read from the table's own log (`_delta_log/<version>.json`, newline-delimited JSON actions; never
its Parquet checkpoints, so no Parquet reader is needed):
  - at a snapshot of batch N: `version_at`, the table version holding the query's batches up to N and
    none after (recorded in the manifest);
  - at a restore: `writes_after` that version, the streaming writes the table holds now that it did not
    then (a later RESTORE to it or before undoes them). Any: the sink is ahead, and a restore is refused;
  - the rewind (`plan_rewind`, `execute`): Delta's own RESTORE of the table to that version, run by a Spark
    tool (spark_jobs/tools/delta_restore.py). Nothing is deleted: the files RESTORE removes from the table
    stay until VACUUM, and `RESTORE ... TO VERSION AS OF <the version before the rewind>` undoes it.
    RESTORE does not roll back the txn ids (the query's id would still skip those batches), so the restored
    checkpoint gets a new query id (restore.py rewrites its `metadata`): Delta then writes every batch after
    N again, once, on top of version N;
  - in the running driver, batch after batch (`LogWatch`): whether a batch Spark counted no rows for wrote.

The log is read as a log of several writers: during a blue/green upgrade the old and the new version of the job
commit in turns, so "which batches did query Q commit" passes other queries' commits. A walk from the newest commit
down stops only where Q cannot have committed anything older that matters: at another query's commit made before
the batch it asks about was planned (less SKEW_MS for clocks of different hosts).

Assumed, and said in the docs: outside an upgrade's cutover the job is the only streaming writer of its table (other
writers' commits after the snapshot are RESTOREd away too, and named in the plan)."""

from __future__ import annotations

import json
import re
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ..errors import Refused
from ..spark_app import SparkAccess, run_spark_tool
from ..storage import Storage, spark_uri

LOG_DIR = "_delta_log/"
# the most two hosts' clocks (a driver's and another's, or a store's) may differ: a walk back through the log stops
# at another query's commit older than the asked-about batch's planning by more than this
SKEW_MS = 300_000
_COMMIT = re.compile(r"^(\d{20})\.json$")
LAST_CHECKPOINT = LOG_DIR + "_last_checkpoint"  # Delta's pointer to the newest checkpoint: {"version": V, ...}
CACHED_COMMITS = 64  # a LogWatch keeps the commits it read (and its looks), for the next batch's question
CONF_PREFIX = "spark.databricks.delta."  # the job's Delta settings: its drivers' and the rewind's
# Delta commands (RESTORE) need Delta's session extension and catalog; the jars come from the job's spark.jars
SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


@dataclass(frozen=True)
class Commit:
    """What the engine needs of one table version."""

    version: int
    txns: dict[str, int]  # query id (appId) -> batch id, of a streaming write
    restored_to: int | None = None  # a RESTORE: the version it brought the table back to
    timestamp_ms: int | None = None  # its commitInfo's timestamp (the committing driver's clock)


@dataclass(frozen=True)
class Write:
    version: int
    query_id: str
    batch_id: int


def commit_key(version: int) -> str:
    return f"{LOG_DIR}{version:020d}.json"


def commit_keys(table: Storage, start_after: str = "") -> dict[int, str]:
    """The table's commit files by version (checkpoints, checksums and temporary files left out); with
    `start_after`, those whose keys sort after it (the listing asks only for them)."""
    found = {}
    for info in table.list(LOG_DIR, start_after):
        if match := _COMMIT.match(info.key[len(LOG_DIR) :]):
            found[int(match[1])] = info.key
    return dict(sorted(found.items()))


def _actions(table: Storage, key: str) -> Iterator[dict[str, Any]]:
    for line in table.read(key).decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def read_commit(table: Storage, version: int, key: str) -> Commit:
    txns: dict[str, int] = {}
    restored_to = timestamp = None
    for action in _actions(table, key):
        if "txn" in action:
            txns[str(action["txn"]["appId"])] = int(action["txn"]["version"])
        info = action.get("commitInfo") or {}
        if info.get("timestamp") is not None:
            timestamp = int(info["timestamp"])
        if info.get("operation") == "RESTORE":  # to a version; by timestamp: unknown, taken as before all
            version_param = (info.get("operationParameters") or {}).get("version")
            restored_to = -1 if version_param is None else int(version_param)
    return Commit(version, txns, restored_to, timestamp)


def live_files(table: Storage) -> list[str]:
    """Keys of the data files the table's newest version holds: its commits replayed from version 0 (for
    checks and tests; a log whose early commits were cleaned up needs Delta's Parquet checkpoints)."""
    keys = commit_keys(table)
    if keys and min(keys) != 0:
        raise Refused(f"the Delta log of {table.uri} starts at version {min(keys)}: read the table with Spark")
    files: dict[str, None] = {}
    for key in keys.values():
        for action in _actions(table, key):
            if "add" in action:
                files[unquote(action["add"]["path"])] = None
            elif "remove" in action:
                files.pop(unquote(action["remove"]["path"]), None)
    return list(files)


def _newest_first(table: Storage) -> Iterator[Commit]:
    for version, key in sorted(commit_keys(table).items(), reverse=True):
        yield read_commit(table, version, key)


def _back_to(table: Storage, query_id: str, planned_ms: int | None) -> Iterator[Commit]:
    """Commits newest first, passing other queries' commits (the versions of a blue/green upgrade commit in turns),
    down to the first commit of another query made before `planned_ms` less SKEW_MS: every commit of `query_id` of
    a batch after the one planned then is newer. `planned_ms` None: down to the table's first commit."""
    for commit in _newest_first(table):
        stamp = commit.timestamp_ms
        other = bool(commit.txns) and query_id not in commit.txns
        if other and planned_ms is not None and stamp is not None and stamp < planned_ms - SKEW_MS:
            return
        yield commit


def is_table(table: Storage) -> bool:
    return bool(commit_keys(table))


def restored_versions(table: Storage) -> list[int]:
    """The versions the table's RESTOREs brought it back to, oldest first (what rewinds did)."""
    commits = (read_commit(table, version, key) for version, key in commit_keys(table).items())
    return [commit.restored_to for commit in commits if commit.restored_to is not None]


def last_batch(table: Storage, query_id: str, planned_ms: int | None) -> int | None:
    """The newest batch the query committed to the table (what Delta's sink compares against), or None: of the
    commits `_back_to` reads (`planned_ms`: when the batch the caller resumes after, or snapshots at, was planned)."""
    for commit in _back_to(table, query_id, planned_ms):
        if query_id in commit.txns:
            return commit.txns[query_id]
    return None


def version_at(table: Storage, query_id: str, batch_id: int, planned_ms: int | None) -> int | None:
    """The table version that holds the query's batches up to `batch_id` and none after: the version before its
    first commit of a later batch, else the newest. Read from the newest down, passing other queries' commits, to
    the query's commit of a batch up to `batch_id` or as far as `_back_to` goes (`planned_ms`: when `batch_id` was
    planned). None: the table has no commit yet."""
    answer: int | None = None
    for commit in _back_to(table, query_id, planned_ms):
        answer = commit.version if answer is None else answer  # the newest, unless the query wrote beyond
        batch = commit.txns.get(query_id)
        if batch is not None and batch <= batch_id:
            break
        if batch is not None:
            answer = commit.version - 1
    return answer if answer is None or answer >= 0 else None


def batches_after(table: Storage, query_id: str, version: int) -> list[int]:
    """The batches of `query_id` the table holds now that version `version` did not (-1: every version), oldest
    first: whether a query wrote a table since a snapshot, whoever else wrote it meanwhile."""
    return sorted(write.batch_id for write in writes_after(table, version) if write.query_id == query_id)


def commit_times(table: Storage, query_id: str | None = None) -> list[float]:
    """When each of the table's versions was committed (its commitInfo's timestamp, epoch seconds), oldest
    first: how often the table gets output; with `query_id`, only that streaming query's commits."""
    times = []
    for key in commit_keys(table).values():
        actions = list(_actions(table, key))
        if query_id is not None and not any((a.get("txn") or {}).get("appId") == query_id for a in actions):
            continue
        times += [
            int(a["commitInfo"]["timestamp"]) / 1000 for a in actions if (a.get("commitInfo") or {}).get("timestamp")
        ]
    return times


def newest_streaming_write(table: Storage) -> Write | None:
    """The table's newest streaming write (any query's), read from the newest commit down: whether a fresh
    query would write on top of an earlier deployment's output. None: no streaming write in its JSON log."""
    for commit in _newest_first(table):
        if commit.txns:
            query_id, batch_id = next(iter(commit.txns.items()))
            return Write(commit.version, query_id, batch_id)
    return None


def version_before_streaming(table: Storage) -> int | None:
    """The newest table version before its first streaming write (a table created, and perhaps filled, by
    other means first): what a fresh start's rewind RESTOREs it to. None when its first version is already
    a streaming write, or its log no longer starts at version 0 (Delta's log retention removed it)."""
    keys = commit_keys(table)
    if not keys or min(keys) != 0:
        return None
    for version, key in keys.items():
        if read_commit(table, version, key).txns:
            return version - 1 if version > 0 else None
    return max(keys)


def writes_after(table: Storage, version: int) -> list[Write]:
    """The streaming writes the table holds now that version `version` did not. A RESTORE brings back what
    the version it names held: to `version` or before, none of them."""
    keys = {v: key for v, key in commit_keys(table).items() if v > version}
    if keys and min(keys) != version + 1:
        raise Refused(
            f"the Delta log of {table.uri} no longer holds version {version + 1} (Delta's log retention removed "
            f"it), so whether the table is ahead of version {version} cannot be told; restore a newer snapshot"
        )
    held: list[Write] = []
    held_at: dict[int, list[Write]] = {}  # after each version: RESTORE to it brings back what it held
    for v, key in keys.items():
        commit = read_commit(table, v, key)
        if commit.restored_to is not None:
            held = list(held_at.get(commit.restored_to, []))  # to `version` or before: none of these
        held += [Write(v, query, batch) for query, batch in commit.txns.items()]
        held_at[v] = list(held)
    return held


class LogWatch:
    """Whether a streaming query's batches wrote to its Delta table, asked by the query's own driver batch after
    batch (spark_jobs/runtime/status.py): a commit of the query's batch N (the txn (query id, N)) made since batch N
    began means it wrote; one made before (an earlier run's, whose txn makes Delta skip the batch) does not.

    Told by the order of the log's versions, not by clocks: each look notes this driver's time once it has listed
    and the newest version it saw; a batch that began after a look wrote iff the query's commit of it is at a later
    version. A batch that began before any look (the first asked of a run, or one that began while the listener was
    behind) is told by time: its commit stamped at or after the batch began. If this batch made it, the stamp is
    this driver's own clock (Delta stamps a commit's commitInfo on the committing driver); an earlier run's stamp is
    another host's, and a clock ahead by more than the time since that commit takes its batch for written, never
    the reverse. The read down the log to that commit passes other writers' commits and stops at one stamped before
    the batch began by more than SKEW_MS: it, and all below it, came before the batch.

    Cheap on an object store: the first look lists the log from its newest checkpoint (`_last_checkpoint`), every
    later one only the keys after the newest version seen; commits are read by name, newest first, as far down as
    the answer needs, and kept (a version's content never changes)."""

    def __init__(self, table: Storage, query_id: str, clock: Callable[[], float] = time.time) -> None:
        self.table = table
        self.query_id = query_id
        self._clock = clock  # this driver's clock: what Spark's progress timestamps are on
        self._newest: int | None = None  # the newest version the last look saw (-1: none at all)
        # (ms when a look had listed, the newest version it saw); bounded: an old look lost only costs a batch its
        # answer by versions
        self._looks: deque[tuple[int, int]] = deque(maxlen=CACHED_COMMITS)
        self._commits: dict[int, Commit] = {}

    def wrote(self, batch_id: int, began_ms: int) -> bool:
        """Whether the table holds the query's commit of `batch_id` made since `began_ms` (when the batch began, on
        this driver's clock: Spark's progress timestamp). Asked in batch order."""
        baseline = self._seen_before(began_ms)
        newest = self._look()
        if baseline is not None:
            return self._committed_after(batch_id, baseline, newest)
        return self._stamped_since(batch_id, began_ms, newest)

    def _seen_before(self, began_ms: int) -> int | None:
        """The newest version a look had seen before `began_ms`: every commit up to it came before the batch. The
        looks older than it are dropped (later batches begin later)."""
        while len(self._looks) > 1 and self._looks[1][0] <= began_ms:
            self._looks.popleft()
        return self._looks[0][1] if self._looks and self._looks[0][0] <= began_ms else None

    def _look(self) -> int:
        """List the commits after the newest one seen (the first time: from the newest checkpoint on) and note the
        newest version now."""
        if self._newest is None:
            start_after = self._checkpoint_stem()
        else:
            start_after = commit_key(self._newest) if self._newest >= 0 else ""
        newest = max(self._listed(start_after), default=-1 if self._newest is None else self._newest)
        self._newest = newest
        self._looks.append((int(self._clock() * 1000), newest))
        return newest

    def _listed(self, start_after: str) -> list[int]:
        """The versions of the commits listed after `start_after`. The listing ends at the first key past them: what
        sorts after the digits (`_last_checkpoint`, the `_sidecars/` of V2 checkpoints) is not listed every time, as
        every backend lists a directory in key order and S3 asks for a next page only when it is read."""
        versions = []
        for info in self.table.list(LOG_DIR, start_after):
            name = info.key[len(LOG_DIR) :]
            if name[:1] > "9":
                break
            if match := _COMMIT.match(name):
                versions.append(int(match[1]))
        return versions

    def _checkpoint_stem(self) -> str:
        """Where the first listing starts: the newest checkpoint's version (Delta writes one every ten commits by
        default), whose files sort after this stem; the whole log when the table has none."""
        try:
            version = int(json.loads(self.table.read(LAST_CHECKPOINT))["version"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return ""
        return f"{LOG_DIR}{version:020d}"

    def _commit(self, version: int) -> Commit | None:
        """Version `version` of the log, read once; None when its file is not there (Delta's log cleanup)."""
        commit = self._commits.get(version)
        if commit is None:
            try:
                commit = read_commit(self.table, version, commit_key(version))
            except FileNotFoundError:
                return None
            self._commits[version] = commit
            while len(self._commits) > CACHED_COMMITS:  # the oldest go first: later questions read newer ones
                del self._commits[min(self._commits)]
        return commit

    def _down(self, newest: int, down_to: int) -> Iterator[tuple[Commit, int | None]]:
        """The commits from `newest` down to `down_to` (excluded), each with the query's batch in it, until one is
        missing. Callers stop at the query's commit of a batch at or below the one asked about: the query's batch ids
        grow with its commits' versions (Delta commits only a batch above its newest txn), so that of the batch asked
        about is not older."""
        for version in range(newest, down_to, -1):
            commit = self._commit(version)
            if commit is None:
                return
            yield commit, commit.txns.get(self.query_id)

    def _committed_after(self, batch_id: int, baseline: int, newest: int) -> bool:
        for _, batch in self._down(newest, baseline):
            if batch is not None and batch <= batch_id:
                return batch == batch_id
        return False  # none after `baseline`: Delta skipped it (its commit is older) or nothing committed it

    def _stamped_since(self, batch_id: int, began_ms: int, newest: int) -> bool:
        for commit, batch in self._down(newest, -1):
            stamp = commit.timestamp_ms
            if batch is not None and batch <= batch_id:
                return batch == batch_id and stamp is not None and stamp >= began_ms
            if stamp is not None and stamp < began_ms - SKEW_MS:
                return False  # made before the batch began, even on a skewed clock: so was everything older
        return False


def describe_writes(writes: list[Write]) -> str:
    """`batches 5..9 of query 1f2e...` per query, for messages."""
    by_query: dict[str, list[int]] = {}
    for write in writes:
        by_query.setdefault(write.query_id, []).append(write.batch_id)
    return ", ".join(f"batches {min(b)}..{max(b)} of query {q}" for q, b in by_query.items())


@dataclass
class Rewind:
    """Bringing a Delta table back to `version` (a plan: nothing happens until `execute`)."""

    location: str
    version: int  # the table version of the snapshot's batch
    current: int  # the table's newest version now: RESTORE to it undoes the rewind
    writes: list[Write]
    query_id: str  # the restored checkpoint's new query id (Delta would skip its old id's batches)
    spark: SparkAccess | None = field(default=None, repr=False)

    def describe(self) -> dict[str, Any]:
        return {
            "sink": self.location,
            "kind": "delta",
            "restored_to_version": self.version,
            "writes_undone": describe_writes(self.writes),
            "new_query_id": self.query_id,
            "undo": f"RESTORE TABLE delta.`{self.location}` TO VERSION AS OF {self.current}",
        }

    def summary(self) -> str:
        return (
            f"Delta table {self.location} is restored to version {self.version} (undoing "
            f"{describe_writes(self.writes)}; Delta keeps their files until VACUUM) and the restored query "
            f"gets the new id {self.query_id}, so that Delta writes those batches again"
        )


def plan_rewind(table: Storage, version: int, writes: list[Write], spark: SparkAccess | None) -> Rewind:
    latest = max(commit_keys(table), default=version)
    return Rewind(table.uri, version, latest, writes, str(uuid.uuid4()), spark)


def execute(table: Storage, rewind: Rewind) -> dict[str, Any]:
    """RESTORE the table with Delta's own command, in a Spark tool with the job's jars and S3A settings.
    Repeating it is harmless: the table is then already at the version's content."""
    spark = rewind.spark or SparkAccess()
    with tempfile.TemporaryDirectory(prefix="savepoints-delta-") as tmp:
        out = Path(tmp) / "result.json"
        args = ["--table", spark_uri(table), "--version", str(rewind.version), "--out", str(out)]
        run_spark_tool("delta_restore", args, conf={**spark.conf, **SESSION_CONF}, env=spark.env)
        return dict(json.loads(out.read_text()))
