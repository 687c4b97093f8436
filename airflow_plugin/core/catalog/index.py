"""An index of the records under one prefix (a job's manifests, its deployment records), kept as ONE object
beside them: what a job holds is one request to read, not one a record. The records stay the truth; the
index is never trusted over them.

The invariant, for every record id: the index's entry matches the record as it is now (both absent
included), or the index holds a MARK for that id. Kept by:

    a writer    marks the ids it will change (a conditional write of the index), changes the records, then
                settles them: sets each entry from the record as it now is and drops its marks (again a
                conditional write). Killed in between, its marks stay.
    a reader    reads the index (a conditional GET: 304 when nothing changed) and, for each marked id, the
                record itself: what it sees is what the records hold.
    settling    reads the index, THEN the records, and writes conditionally on that index version. A writer
                that changed a record after it was read had marked it first: its mark is in that version
                (settling keeps it), or the index changed since and the write fails and settling starts over.
    a dead mark its writer was killed: the mark is older than DEAD_AFTER, or its holder is a process of this
                host that no longer exists. Whoever finds one settles its id and drops it. A live writer
                changes its records right after marking (one request, whose retries end long before).
    missing, damaged
                the index is rebuilt from the records. A reader saves what it rebuilt if it can (a reader
                without write access still sees the truth); `validate` also compares the index with a
                listing of the records (ids and versions) and settles every difference, for what wrote
                records without marking (by hand, a bucket restored from a backup).

Records are changed only by conditional writes (storage/base.py: a record version is a token), so a deleted
record is never written back by a late writer, and a settle can tell a write it knows from another's.
Pure engine code: no airflow, no pyspark.

Over 300 lines: one protocol; marking, settling, reading, rebuilding and validating share its state, its
object's form and the argument above."""

from __future__ import annotations

import gzip
import json
import logging
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from ..errors import Conflict, StoreUnavailable
from ..lease import default_holder, holder_gone
from ..parallel import map_parallel
from ..storage import ObjectInfo, Storage

log = logging.getLogger(__name__)

FORMAT = 1
DEAD_AFTER = 3600.0  # seconds: a mark this old was left by a killed writer (a write's retries end far sooner)
MAX_ATTEMPTS = 60  # conditional writes of the index lost to other writers before giving up
READERS = 16  # records read at once (marked ids, a settle, a rebuild)


class Versioned(Protocol):
    @property
    def version(self) -> str | None:
        """The record version (storage token) the entry was made from."""
        ...


E = TypeVar("E", bound=Versioned)


class Records(Protocol[E]):
    """What an index knows of one kind of record: where each lives, and its entry (what listing needs)."""

    what: str  # "snapshot", "deployment": for messages

    def key(self, record_id: str) -> str: ...

    def listing(self) -> dict[str, ObjectInfo]:
        """Every record under the prefix: id -> its object (with its version)."""
        ...

    def entry(self, record_id: str, raw: bytes, version: str) -> E | None:
        """The entry of a record's content (None: unreadable, and warned about)."""
        ...

    def dump(self, entry: E) -> dict[str, Any]: ...

    def load(self, data: dict[str, Any], version: str) -> E:
        """The entry `dump` gave, keeping `version`."""
        ...


@dataclass(frozen=True)
class Mark:
    """A writer's notice that it is changing record `id`: readers read that record themselves."""

    id: str
    holder: str  # user@host:<process> (lease.py): a mark of a process seen gone is dead at once
    at: float  # seconds since the epoch, the writer's clock
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))

    def dead(self, now: float) -> bool:
        return now - self.at > DEAD_AFTER or holder_gone(self.holder)


@dataclass(frozen=True)
class Known:
    """What a writer did to one record: replaced version `prior` (None: created it) with `version` (None:
    deleted it), whose entry is `entry`. Lets its settle skip reading the record back."""

    prior: str | None
    version: str | None
    entry: Any = None


@dataclass
class _State:
    """The index object's content: entries as stored (id -> (record version, dumped entry)) and marks."""

    entries: dict[str, tuple[str, dict[str, Any]]]
    marks: list[Mark]

    def to_bytes(self) -> bytes:
        data = {
            "format": FORMAT,
            "updated_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "marks": [vars(m) for m in self.marks],
            "entries": [{"id": i, "version": v, "entry": e} for i, (v, e) in sorted(self.entries.items())],
        }
        return gzip.compress(json.dumps(data, separators=(",", ":")).encode(), compresslevel=6, mtime=0)

    @classmethod
    def from_bytes(cls, raw: bytes) -> _State:
        """ValueError when damaged or of an unknown format."""
        try:
            data = json.loads(gzip.decompress(raw))
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format') if isinstance(data, dict) else None!r}")
            entries = {str(e["id"]): (str(e["version"]), dict(e["entry"])) for e in data["entries"]}
            return cls(entries, [Mark(**m) for m in data["marks"]])
        except (OSError, EOFError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(str(exc) or type(exc).__name__) from None

    def marked(self, record_id: str) -> tuple[Mark, ...]:
        return tuple(m for m in self.marks if m.id == record_id)

    def version(self, record_id: str) -> str | None:
        found = self.entries.get(record_id)
        return found[0] if found else None


# What this process last read of each index: (storage, key) -> (object version, state), for conditional GETs.
_cache: dict[tuple[str, str], tuple[str, _State]] = {}
_cache_lock = threading.Lock()


class RecordIndex(Generic[E]):
    """One index object at `key`, over the records `records` describes."""

    def __init__(self, storage: Storage, key: str, records: Records[E]) -> None:
        self.storage, self.key, self.records = storage, key, records
        self.where = f"{storage.uri}/{key}"

    # ------------------------------------------------------------ reading

    def view(self) -> dict[str, E]:
        """Every record's entry, as the records hold them now: the index, and each marked record read."""
        state = self._read()[0]
        now = time.time()
        dead = [m for m in state.marks if m.dead(now)]
        if dead:
            try:
                state = self._settle({m.id for m in dead}, {}, dead)
            except (Conflict, StoreUnavailable) as exc:  # read-only access, or busy: the marks are read below
                log.warning("could not settle dead marks of %s (%s): their records are read instead", self.where, exc)
        entries = self._decode(state)
        for record_id, found in self._read_records({m.id for m in state.marks}):
            if found is None:
                entries.pop(record_id, None)
            else:
                entries[record_id] = found[1]
        return entries

    def validate(self) -> tuple[dict[str, E], list[str]]:
        """The view, compared with a listing of the records (ids and versions); every difference is settled
        (the records read). Returns the view and the ids that differed (writers that did not mark)."""
        entries = self.view()
        listed = self.records.listing()
        versions = {i: e.version for i, e in entries.items()}
        differ = sorted(
            {i for i, info in listed.items() if versions.get(i) != info.version} | (set(entries) - set(listed))
        )
        if not differ:
            return entries, []
        log.warning(
            "%s differs from its %ss in %d: settling them from the records", self.where, self.records.what, len(differ)
        )
        try:
            self._settle(set(differ), {}, [])
        except (Conflict, StoreUnavailable) as exc:
            log.warning("could not save the settled %s (%s): read from the records instead", self.where, exc)
            for record_id, found in self._read_records(differ):
                if found is None:
                    entries.pop(record_id, None)
                else:
                    entries[record_id] = found[1]
            return entries, differ
        return self.view(), differ

    def rebuild(self) -> dict[str, E]:
        """A new index from every record (marks of writers still at work are kept), saved."""
        try:
            _, token = self._fetch()
        except FileNotFoundError:
            token = None
        state, saved = self._rebuilt(token, keep=True)
        if saved is None:
            raise StoreUnavailable(f"could not save the rebuilt {self.where}: check write access to the store")
        return self._decode(state)

    def stored(self) -> tuple[dict[str, str], list[Mark]] | None:
        """What the index object holds now, without reading any record: each entry's record version, and the
        marks (None: no index, or a damaged one). For checks of the invariant and for reports."""
        try:
            state = self._fetch()[0]
        except FileNotFoundError:
            return None
        return None if state is None else ({i: v for i, (v, _) in state.entries.items()}, list(state.marks))

    # ------------------------------------------------------------ writing

    @contextmanager
    def changing(self, ids: Iterable[str]) -> Iterator[dict[str, Known]]:
        """Mark `ids`, let the caller change those records (reporting what it did in the yielded dict), then
        settle them. A settle that fails leaves the marks: readers read those records until one settles."""
        wanted = sorted(set(ids))
        known: dict[str, Known] = {}
        if not wanted:
            yield known
            return
        marks = self._mark(wanted)
        try:
            yield known
        finally:
            try:
                self._settle(set(wanted), known, marks)
            except Exception as exc:  # the change stands: its marks make readers read those records
                log.warning("%s: %s left marked (%s); readers read them until it is settled", self.where, wanted, exc)

    def settle(self, ids: Iterable[str]) -> None:
        """Set the entries of `ids` from their records as they are now."""
        self._settle(set(ids), {}, [])

    # ------------------------------------------------------------ the protocol

    def _mark(self, ids: list[str]) -> list[Mark]:
        holder = default_holder()
        marks = [Mark(i, holder, time.time()) for i in ids]
        self._swap(lambda state: _State(state.entries, [*state.marks, *marks]))
        return marks

    def _settle(self, ids: set[str], known: Mapping[str, Known], drop: list[Mark]) -> _State:
        """Set the entries of `ids` from their records, read after the index version written against; drop
        `drop`. Records whose index entry and marks did not change since the last attempt are not read again."""
        found: dict[str, tuple[str, E] | None] = {}
        basis: dict[str, tuple[str | None, tuple[Mark, ...]]] = {}

        def change(state: _State) -> _State:
            todo = []
            for record_id in sorted(ids):
                now = (state.version(record_id), state.marked(record_id))
                if record_id in found and basis.get(record_id) == now:
                    continue
                basis[record_id] = now
                mine = known.get(record_id)
                if mine is not None and mine.prior is not None and mine.prior == state.version(record_id):
                    found[record_id] = (mine.version, mine.entry) if mine.version else None  # nobody settled since
                else:
                    todo.append(record_id)
            current = map_parallel(lambda i: self._current(i, state, known), todo, concurrency=READERS)
            found.update(zip(todo, current, strict=True))
            entries = dict(state.entries)
            for record_id in ids:
                result = found[record_id]
                if result is None:
                    entries.pop(record_id, None)
                else:
                    entries[record_id] = (result[0], self.records.dump(result[1]))
            dropped = {(m.id, m.nonce) for m in drop}
            return _State(entries, [m for m in state.marks if (m.id, m.nonce) not in dropped])

        return self._swap(change)

    def _current(self, record_id: str, state: _State, known: Mapping[str, Known]) -> tuple[str, E] | None:
        """The record as it is now: from what the index or the writer already knows of its version (one
        HEAD), else read."""
        info = self.storage.stat(self.records.key(record_id))
        if info is None or info.version is None:
            return None if info is None else self._read_record(record_id)
        mine = known.get(record_id)
        if mine is not None and mine.version == info.version and mine.entry is not None:
            return info.version, mine.entry
        if state.version(record_id) == info.version:
            version, data = state.entries[record_id]
            return version, self.records.load(data, version)
        return self._read_record(record_id)

    def _swap(self, change: Callable[[_State], _State]) -> _State:
        """Read the index, apply `change`, write it conditionally; when another writer came first, all again
        (after a random pause that grows: many writers at once spread out). A missing or damaged index is
        rebuilt first."""
        for attempt in range(MAX_ATTEMPTS):
            state, token = self._read(writing=True)
            if token is None:
                raise StoreUnavailable(f"could not save {self.where}: check write access to the store")
            new = change(state)
            try:
                written = self.storage.replace(self.key, new.to_bytes(), token)
            except Conflict:
                time.sleep(random.uniform(0, min(1.0, 0.01 * 2**attempt)))
                continue
            _remember(self.storage, self.key, written, new)
            return new
        raise Conflict(
            f"{self.where} kept changing under {MAX_ATTEMPTS} attempts to update it (many writers at once): try again"
        )

    # ------------------------------------------------------------ storage

    def _fetch(self) -> tuple[_State | None, str]:
        """The index as stored and its token; None when damaged. FileNotFoundError when missing."""
        ident = (self.storage.uri, self.key)
        with _cache_lock:
            cached = _cache.get(ident)
        got = self.storage.read_if_changed(self.key, cached[0]) if cached else self.storage.read_with_token(self.key)
        if got is None and cached is not None:
            return cached[1], cached[0]
        assert got is not None
        raw, token = got
        try:
            state = _State.from_bytes(raw)
        except ValueError as exc:
            log.warning("%s is damaged (%s): rebuilding it from the %ss", self.where, exc, self.records.what)
            return None, token
        _remember(self.storage, self.key, token, state)
        return state, token

    def _read(self, *, writing: bool = False) -> tuple[_State, str | None]:
        """The index and its token; a missing or damaged one rebuilt from the records first (token None: the
        rebuilt one was not saved: it could not be, or a reader found no record to index)."""
        try:
            state, token = self._fetch()
        except FileNotFoundError:
            return self._rebuilt(None, keep=False, save_empty=writing)
        if state is None:
            return self._rebuilt(token, keep=False)
        return state, token

    def _rebuilt(self, token: str | None, *, keep: bool, save_empty: bool = True) -> tuple[_State, str | None]:
        """Every record read after `token` (None: no index yet) was; saved conditionally on it. Marks of that
        index that are not dead are kept (`keep`). Whoever saved one first wins; a reader that cannot save
        (no write access) still gets the truth, with no token. With no record and no index, nothing is saved
        unless `save_empty` (a writer's first mark): a read leaves a job without records as it was."""
        old = None
        if keep and token is not None:
            with _cache_lock:
                cached = _cache.get((self.storage.uri, self.key))
            old = cached[1] if cached and cached[0] == token else None
        entries: dict[str, tuple[str, dict[str, Any]]] = {}
        for record_id, found in self._read_records(self.records.listing()):
            if found is not None:
                entries[record_id] = (found[0], self.records.dump(found[1]))
        now = time.time()
        state = _State(entries, [m for m in (old.marks if old else []) if not m.dead(now)])
        if token is None and not entries and not save_empty:
            return state, None
        log.info("rebuilt %s from %d %ss", self.where, len(entries), self.records.what)
        try:
            written = (
                self.storage.create(self.key, state.to_bytes())
                if token is None
                else self.storage.replace(self.key, state.to_bytes(), token)
            )
        except Conflict:  # another rebuild or writer came first: theirs holds at least as much
            return self._read(writing=save_empty)
        except StoreUnavailable as exc:
            log.warning("could not save the rebuilt %s (%s): read from the %ss", self.where, exc, self.records.what)
            return state, None
        _remember(self.storage, self.key, written, state)
        return state, written

    def _read_records(self, ids: Iterable[str]) -> Iterator[tuple[str, tuple[str, E] | None]]:
        """(id, what `_read_record` found) for each id, read in parallel."""
        ordered = sorted(ids)
        return zip(ordered, map_parallel(self._read_record, ordered, concurrency=READERS), strict=True)

    def _read_record(self, record_id: str) -> tuple[str, E] | None:
        try:
            raw, version = self.storage.read_with_token(self.records.key(record_id))
        except FileNotFoundError:
            return None
        entry = self.records.entry(record_id, raw, version)
        return None if entry is None else (version, entry)

    def _decode(self, state: _State) -> dict[str, E]:
        return {i: self.records.load(data, version) for i, (version, data) in state.entries.items()}


def _remember(storage: Storage, key: str, token: str, state: _State) -> None:
    with _cache_lock:
        _cache[(storage.uri, key)] = (token, state)
