"""The snapshot engine: read a checkpoint's restart point, take, store, restore and verify snapshots."""
