"""The store's layout: which key holds what. Every key of the store is spelled here and nowhere else; the
engine, the Airflow layer and the job runtime ask this module.

    jobs/<job>/snapshots/<snapshot_id>/manifest.json             a snapshot; status COMPLETED is its commit
    jobs/<job>/deployments/<deployment_id>/deployment.json       the deployment record (the launcher's)
    jobs/<job>/deployments/<deployment_id>/status.json           its heartbeat (written by the job runtime)
    jobs/<job>/deployments/<deployment_id>/control/<request>.json  requests to the running job (stop, start)
    jobs/<job>/lease.json                                        the job lease: one operation at a time
    jobs/<job>/writers.json                                      the fence: the deployments that may commit the job's
                                                                 output now, and its generation (core/jobs/fence.py)
    jobs/<job>/catalog/snapshots.json.gz                         the job's snapshot catalog: what listing needs of
                                                                 each manifest, kept beside them (core/catalog/index.py)
    jobs/<job>/catalog/deployments.json.gz                       the job's deployment index: every record, and the
                                                                 final heartbeat of each retired deployment
    jobs/<job>/upgrades/<upgrade_id>.json                        an upgrade: its mode, state and steps' results
    jobs/<job>/reconcile.json                                    what the reconcile loop keeps of the job: restarts,
                                                                 the last stable version, failed versions, a pause
    format.json                                                  the store's format version and packing settings
    usage.json                                                   what the store held after the last prune: bytes,
                                                                 objects, unreferenced bytes awaiting gc (metrics)
    blobs/<sha256[:2]>/<sha256>                                  a file's content as one object (large files; stores
                                                                 of format 1: every file)
    packs/<id[:2]>/<id>.pack                                     small files' contents, concatenated (format 2)
    packs/<id[:2]>/<id>.retired                                  written when a repack moved a pack's contents: the
                                                                 pack's grace period starts then

Names that become part of a key (jobs, snapshot and deployment ids, request ids, label keys) pass
`check_name`: no '/', no '..', nothing that could escape its place."""

from __future__ import annotations

import re

from .errors import InvalidInput

JOBS = "jobs/"
BLOBS = "blobs/"
PACKS = "packs/"
FORMAT = "format.json"
USAGE = "usage.json"
MANIFEST = "manifest.json"
DEPLOYMENT = "deployment.json"
STATUS = "status.json"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        shown = value if not isinstance(value, str) or len(value) <= 40 else f"{value[:40]}... ({len(value)} chars)"
        raise InvalidInput(
            f"invalid {what} {shown!r}: use letters, digits, '_', '.', '-' (at most 128, not starting with '.')"
        )
    return value


def is_valid_name(value: str) -> bool:
    return bool(_NAME.match(value))


def job_prefix(job: str) -> str:
    return f"{JOBS}{check_name(job, 'job name')}/"


def snapshots_prefix(job: str | None = None) -> str:
    """Where manifests live: of one job, or (None) of every job (filter keys with `is_manifest`)."""
    return f"{job_prefix(job)}snapshots/" if job else JOBS


def snapshot_prefix(job: str, snapshot_id: str) -> str:
    return f"{snapshots_prefix(job)}{check_name(snapshot_id, 'snapshot id')}/"


def manifest_key(job: str, snapshot_id: str) -> str:
    return snapshot_prefix(job, snapshot_id) + MANIFEST


def is_manifest(key: str) -> bool:
    parts = key.split("/")
    return len(parts) == 5 and parts[0] == "jobs" and parts[2] == "snapshots" and parts[4] == MANIFEST


def snapshot_id_of(key: str, job: str) -> str | None:
    """The snapshot id of a manifest's key (None for any other key)."""
    prefix = snapshots_prefix(job)
    if not key.startswith(prefix) or not key.endswith("/" + MANIFEST):
        return None
    rest = key[len(prefix) :].split("/")
    return rest[0] if len(rest) == 2 else None


def catalog_prefix(job: str) -> str:
    return f"{job_prefix(job)}catalog/"


def snapshot_catalog_key(job: str) -> str:
    """The job's snapshot catalog (catalog/snapshots.py): never the truth, the manifests are."""
    return catalog_prefix(job) + "snapshots.json.gz"


def deployment_index_key(job: str) -> str:
    """The job's deployment index (jobs/deployment_index.py): never the truth, the records are."""
    return catalog_prefix(job) + "deployments.json.gz"


def deployments_prefix(job: str) -> str:
    return f"{job_prefix(job)}deployments/"


def deployment_prefix(job: str, deployment_id: str) -> str:
    return f"{deployments_prefix(job)}{check_name(deployment_id, 'deployment id')}/"


def deployment_key(job: str, deployment_id: str) -> str:
    return deployment_prefix(job, deployment_id) + DEPLOYMENT


def deployment_id_of(key: str, job: str) -> str | None:
    """The deployment id of a deployment record's key (None for any other key)."""
    prefix = deployments_prefix(job)
    if not key.startswith(prefix) or not key.endswith("/" + DEPLOYMENT):
        return None
    return key[len(prefix) :].split("/")[0]


def status_key(job: str, deployment_id: str) -> str:
    return deployment_prefix(job, deployment_id) + STATUS


def control_prefix(job: str, deployment_id: str) -> str:
    return deployment_prefix(job, deployment_id) + "control/"


def control_key(job: str, deployment_id: str, request_id: str) -> str:
    return control_prefix(job, deployment_id) + f"{check_name(request_id, 'request id')}.json"


def upgrades_prefix(job: str) -> str:
    return f"{job_prefix(job)}upgrades/"


def upgrade_key(job: str, upgrade_id: str) -> str:
    """An upgrade's record: its mode, state and what each step produced (core/upgrades/)."""
    return f"{upgrades_prefix(job)}{check_name(upgrade_id, 'upgrade id')}.json"


def reconcile_key(job: str) -> str:
    return f"{job_prefix(job)}reconcile.json"


def lease_key(job: str) -> str:
    return job_prefix(job) + "lease.json"


def writers_key(job: str) -> str:
    return job_prefix(job) + "writers.json"


def job_of(key: str) -> str | None:
    """The job a key under jobs/ belongs to."""
    parts = key.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] == "jobs" else None


def blob_key(sha256: str) -> str:
    """Contents are stored once, by checksum: snapshots share them, so deleting one breaks no other."""
    return f"{BLOBS}{sha256[:2]}/{sha256}"


def staging_key(token: str) -> str:
    """Where a server-side copy lands until S3 has told its checksum (snapshots/blobs.py): under blobs/, so
    that garbage collection removes one a killed create left behind like any unreferenced blob."""
    return f"{BLOBS}staging/{check_name(token, 'staging token')}"


def pack_key(pack_id: str) -> str:
    """A pack: many small contents concatenated; manifests say which byte range holds which file."""
    return f"{PACKS}{pack_id[:2]}/{check_name(pack_id, 'pack id')}.pack"


def retired_key(pack_key_: str) -> str:
    """The marker a repack leaves beside a pack it emptied: its time starts the pack's grace period."""
    return pack_key_.removesuffix(".pack") + ".retired"


def pack_of_retired(key: str) -> str | None:
    """The pack a retired marker stands for (None for any other key)."""
    return key.removesuffix(".retired") + ".pack" if key.startswith(PACKS) and key.endswith(".retired") else None


def is_stored_content(key: str) -> bool:
    """Whether a key holds file contents (a single-object blob or a pack): what garbage collection sweeps."""
    return key.startswith(BLOBS) or (key.startswith(PACKS) and key.endswith(".pack"))
