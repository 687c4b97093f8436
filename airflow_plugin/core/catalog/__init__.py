"""The catalogs: one object per job beside its records (snapshot manifests, deployment records), listing them
without reading each, never trusted over them:

    index.py      how a catalog stays true to its records: marks, settling, rebuilding, validating (RecordIndex)
    snapshots.py  what the snapshot catalog holds of each manifest (SnapshotEntry) and how it reads them
    rebuild.py    the catalogs of a store's jobs as a whole, rebuilt or checked (`savepoints catalog`)

The deployment index's entries (DeploymentEntry, DeploymentRecords) stay with the deployment records in
core/jobs/deployments.py: each needs the other (an entry keeps a retired deployment's final heartbeat, which the
records' reader takes from the index)."""
