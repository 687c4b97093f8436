"""Repack (restic's `prune --max-unused`): the referenced contents of a mostly unreferenced pack are copied
into a new pack and every manifest that points into the old one is pointed at the new one. Nothing is
deleted here: the old pack, now referenced by no manifest, goes through garbage collection (plan.py) once
its grace period, counted from the `.retired` marker written here, has passed.

The plan chose the pack from the catalogs, which overstate how much of it is unused when snapshots share
its contents: the manifests that reference it are read first, and a pack that turns out to be used enough
is left alone.

Crash safety, step by step: (1) the contents are read and checked against their checksums (a corrupt
content is never copied: the pack is left alone); (2) the new pack is written (killed here: an
unreferenced young pack, collected later); (3) the marker is written, before any manifest changes, so the
old pack's grace period starts before it can become unreferenced; (4) each manifest is changed with one
conditional write, on its version as it is then (killed in between: some manifests point to the old pack,
some to the new, both exist). At no point does a manifest reference a missing object. A create in flight
never races this: the caller checks for snapshots in flight right before (prune.py `_blocked`)."""

from __future__ import annotations

import logging

from ..catalog.snapshots import SnapshotEntry
from ..errors import NotFound
from ..layout import retired_key
from ..records.manifest import FileEntry, Manifest
from ..snapshots.blobs import checksum_problem
from ..snapshots.store import SnapshotStore

log = logging.getLogger(__name__)


def repack(store: SnapshotStore, pack: str, snapshots: list[SnapshotEntry], max_unused: float) -> str | None:
    """Move the contents of `pack` that the snapshots referencing it use into a new pack; returns why not,
    or None."""
    referencing = [m for m in store.manifests([s for s in snapshots if pack in s.objects]) if _points_into(m, pack)]
    wanted: dict[int, FileEntry] = {}
    for m in referencing:
        for entry in m.files:
            if entry.key == pack:
                wanted.setdefault(entry.offset, entry)
    if not wanted:
        return f"{pack} is referenced by no manifest any more"
    info = store.storage.stat(pack)
    unused = 1 - sum(e.size for e in wanted.values()) / info.size if info and info.size else 0.0
    if unused <= max_unused:
        return f"{pack} was not repacked: its manifests use all but {unused:.0%} of it (max unused {max_unused:.0%})"
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

    def repoint(current: Manifest) -> None:
        for entry in current.files:
            if entry.key == pack and entry.offset in moved:
                entry.key, entry.offset = moved[entry.offset]

    for m in referencing:
        try:
            store.update(m.job, m.id, repoint)  # on the manifest as it is then: pin or verify may have written it
        except NotFound:
            continue  # deleted meanwhile: nothing to point anywhere
    log.info("repacked %d contents of %s into %d new pack(s)", len(moved), pack, max(writer.packs, 1))
    return None


def _points_into(manifest: Manifest, pack: str) -> bool:
    return any(entry.key == pack for entry in manifest.files)
