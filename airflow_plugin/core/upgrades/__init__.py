"""Upgrades of a running job to another version, in one of two modes, as a record in the store advanced by
steps that can run again after a crash: record.py (the record and its phases), mode.py (which mode applies,
and why), steps.py (one handler per phase), run.py (begin, drive, resume, cancel). The CLI's `savepoints
upgrade`, the upgrade DAG and the Savepoints page share them."""
