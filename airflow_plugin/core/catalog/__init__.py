"""The catalogs: one object per job beside its records (snapshot manifests, deployment records), listing them
without reading each, never trusted over them:

    index.py        how a catalog stays true to its records: marks, settling, rebuilding, validating (RecordIndex)
    snapshots.py    the snapshot catalog: what it holds of each manifest (SnapshotEntry) and how it reads them
    deployments.py  the deployment index: each deployment record, and a retired one's final heartbeat
    rebuild.py      the catalogs of a store's jobs as a whole, rebuilt or checked (`savepoints catalog`)

The records they list, and their forms, are core/records/; who writes them (through the catalog, so that
it stays true): core/snapshots/store.py and core/jobs/deployments.py."""
