"""Repack (restic's `prune --max-unused`): the referenced contents of mostly unreferenced packs are copied into new
packs and every manifest that points into an old one is pointed at the new ones. Nothing is deleted here: an old
pack, now referenced by no manifest, goes through garbage collection (plan.py) once its grace period, counted from
the `.retired` marker written here, has passed.

The plan chose the packs from the catalogs, which overstate how much of a pack is unused when snapshots share its
contents: the manifests that reference them are read first, and a pack that turns out to be used enough is left
alone.

All the packs of one prune are repacked together, each manifest written once for all of them: written once a pack,
a manifest was read and written as many times as the packs it points into (at 1 GB of state, 50 savepoints pruned
to 10 moved 404 MB up and 369 MB down through the process). A content is known by its offset and size in its pack:
an empty file has the offset of the content written after it.

Crash safety, step by step: (1) the contents are read and checked against their checksums (a pack with a corrupt
content is never moved: it is left alone); (2) the new packs are written (killed here: unreferenced young packs,
collected later), and found still there (another prune may collect an unreferenced pack older than the grace
period); (3) the markers are written, before any manifest changes, so each old pack's grace period starts
before it can become unreferenced; (4) each manifest is changed with one conditional write, on its version as it is
then (killed in between: some manifests point to old packs, some to new ones, all exist). At no point does a
manifest reference a missing object, but for one race: a second prune that planned a new pack as unreferenced
(which needs this repack to have run for longer than the grace period) and deletes it between the check in (2)
and the re-pointing. A create in flight never races this: the caller checks for snapshots in
flight right before (prune.py `_blocked`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..catalog.snapshots import SnapshotEntry
from ..errors import NotFound
from ..layout import retired_key
from ..records.manifest import FileEntry, Manifest
from ..snapshots.blobs import BlobWriter, checksum_problem
from ..snapshots.store import SnapshotStore

log = logging.getLogger(__name__)

Moved = dict[tuple[int, int], tuple[str, int]]  # a content's span in its old pack: its new pack and offset


def repack(store: SnapshotStore, packs: list[str], snapshots: list[SnapshotEntry], max_unused: float) -> Repacked:
    """Move the contents of `packs` that the snapshots referencing them use into new packs."""
    result = Repacked()
    candidates = set(packs)
    # pass 1: what each pack's manifests use of it, a manifest at a time (only those entries are kept)
    wanted: dict[str, dict[tuple[int, int], FileEntry]] = {pack: {} for pack in packs}
    pointing: list[tuple[str, str]] = []
    for m in store.manifests([s for s in snapshots if candidates.intersection(s.objects)]):
        hits = [entry for entry in m.files if entry.key in candidates]
        if hits:
            pointing.append((m.job, m.id))
        for entry in hits:
            wanted[entry.key].setdefault(entry.span, entry)
    worth = [pack for pack in packs if _worth_it(store, pack, wanted[pack], max_unused, result.notes)]
    writer = store.blobs.writer()
    moves: dict[str, Moved] = {}
    for pack in worth:
        moved = _move(store, writer, wanted[pack])
        if isinstance(moved, str):  # its copied contents: unused bytes in a new pack
            result.notes.append(f"{pack} was not repacked: {moved} (run `savepoints verify` on the snapshots using it)")
        else:
            moves[pack] = moved
    if not moves:
        return result
    writer.flush()
    # the new packs are referenced by nothing until the manifests below: a prune running beside this one collects
    # such a pack once it is older than the grace period. Checked right before: never re-point into a missing one
    # (an empty content is never read, so the key it was given need not exist: a pack whose buffer was empty then
    # is never written)
    written = {key for moved in moves.values() for (_, size), (key, _) in moved.items() if size}
    if missing := sorted(key for key in written if store.storage.stat(key) is None):
        result.notes.append(
            f"repack stopped: its new pack {missing[0]} is gone (another prune collected it): nothing was re-pointed, "
            "the next prune repacks again"
        )
        return result
    for pack in moves:
        store.storage.write(retired_key(pack), b"")

    def repoint(current: Manifest) -> None:
        for entry in current.files:
            if (moved := moves.get(entry.key)) is not None and entry.span in moved:
                entry.key, entry.offset = moved[entry.span]

    for job, snapshot_id in pointing:
        try:
            store.update(job, snapshot_id, repoint)  # on the manifest as it is then: pin or verify may have written it
        except NotFound:
            continue  # deleted meanwhile: nothing to point anywhere
    result.packs = len(moves)
    log.info(
        "repacked %d contents of %d pack(s) into %d new pack(s), %d manifest(s) re-pointed",
        sum(len(moved) for moved in moves.values()),
        len(moves),
        max(writer.packs, 1),
        len(pointing),
    )
    return result


def _move(store: SnapshotStore, writer: BlobWriter, wanted: dict[tuple[int, int], FileEntry]) -> Moved | str:
    """Copy the contents `wanted` of one pack into the writer's packs, each checked against its checksum: where each
    went, or the first problem found."""
    moved: Moved = {}

    def copy(entry: FileEntry, data: bytes | None) -> str | None:
        problem = checksum_problem(entry, data)
        if problem is None and data is not None:
            key, offset, sealed = writer.append(data)
            writer.write(sealed)
            moved[entry.span] = (key, offset)
        return problem

    problems = [p for p in store.blobs.read_each(list(wanted.values()), copy, concurrency=4) if p]
    return problems[0] if problems else moved


@dataclass
class Repacked:
    """How many packs a repack moved, and why it left the others alone."""

    packs: int = 0
    notes: list[str] = field(default_factory=list)


def _worth_it(
    store: SnapshotStore, pack: str, wanted: dict[tuple[int, int], FileEntry], max_unused: float, notes: list[str]
) -> bool:
    """Whether the manifests leave more than `max_unused` of `pack` unused (else why not, in `notes`)."""
    if not wanted:
        notes.append(f"{pack} is referenced by no manifest any more")
        return False
    info = store.storage.stat(pack)
    unused = 1 - sum(e.size for e in wanted.values()) / info.size if info and info.size else 0.0
    if unused <= max_unused:
        notes.append(
            f"{pack} was not repacked: its manifests use all but {unused:.0%} of it (max unused {max_unused:.0%})"
        )
        return False
    return True
