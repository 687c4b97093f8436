"""What the store's objects hold, and how each is serialized (where each lives: layout.py):

    manifest.py    a snapshot's manifest: its files, source positions, sinks, history (the snapshot's commit)
    deployment.py  a deployment's record, the heartbeat its runtime writes, the control requests it reads

The catalogs (core/catalog/) list these records; the snapshot store and the deployments (core/snapshots/,
core/jobs/deployments.py) read and write them."""
