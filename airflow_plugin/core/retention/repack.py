"""Repack (restic's `prune --max-unused`): the referenced contents of a mostly unreferenced pack are copied
into a new pack and every manifest that points into the old one is pointed at the new one. Nothing is
deleted here: the old pack, now referenced by no manifest, goes through garbage collection (plan.py) once
its grace period, counted from the `.retired` marker written here, has passed.

Crash safety, step by step: (1) the contents are read and checked against their checksums (a corrupt
content is never copied: the pack is left alone); (2) the new pack is written (killed here: an
unreferenced young pack, collected later); (3) the marker is written, before any manifest changes, so the
old pack's grace period starts before it can become unreferenced; (4) each manifest is read again and
rewritten with one atomic write (killed in between: some manifests point to the old pack, some to the
new, both exist). At no point does a manifest reference a missing object. A create in flight never races
this: the caller checks for snapshots in flight right before (prune.py `_blocked`)."""

from __future__ import annotations

import logging

from ..layout import retired_key
from ..snapshots.blobs import checksum_problem
from ..snapshots.manifest import FileEntry, Manifest
from ..snapshots.store import SnapshotStore

log = logging.getLogger(__name__)


def repack(store: SnapshotStore, pack: str, manifests: list[Manifest]) -> str | None:
    """Move the contents of `pack` that `manifests` reference into a new pack; returns why not, or None."""
    referencing = [m for m in manifests if any(e.key == pack for e in m.files)]
    wanted: dict[int, FileEntry] = {}
    for m in referencing:
        for entry in m.files:
            if entry.key == pack:
                wanted.setdefault(entry.offset, entry)
    if not wanted:
        return f"{pack} is referenced by no manifest any more"
    writer = store.blobs.writer()
    moved: dict[int, tuple[str, int]] = {}

    def copy(entry: FileEntry, data: bytes | None) -> str | None:
        problem = checksum_problem(entry, data)
        if problem is None and data is not None:
            key, offset, sealed = writer.append(data)
            writer.write(sealed)
            moved[entry.offset] = (key, offset)
        return problem

    problems = [p for p in store.blobs.read_each(list(wanted.values()), copy, concurrency=4) if p]
    if problems:
        return f"{pack} was not repacked: {problems[0]} (run `savepoints verify` on the snapshots using it)"
    writer.flush()
    store.storage.write(retired_key(pack), b"")
    for m in referencing:
        current = store.get(m.job, m.id)  # read again: pin or verify may have written it since
        for entry in current.files:
            if entry.key == pack and entry.offset in moved:
                entry.key, entry.offset = moved[entry.offset]
        store.put(current)
    log.info("repacked %d contents of %s into %d new pack(s)", len(moved), pack, max(writer.packs, 1))
    return None
