"""An upgrade of a running job to another version, whole: a record in the store advanced by steps that can run
again after a crash, in one of four modes (stop-and-restore, blue/green, replay, migration).

    record.py     the record and its phases
    mode.py       which mode applies, and why
    preflight.py  will the new version run on the running one's state (before anything stops)
    launch.py     the new version launched beside the old one, or pre-started and activated
    steps.py      one handler per phase: catch-up, gate, cutover, health gate, abort
    replay.py     where a replay starts and which windows it rebuilds
    migration.py  a state migration run on a throwaway copy
    rollback.py   the old version back from the savepoint the upgrade cut over from
    run.py        begin, drive, resume, cancel

The CLI's `savepoints upgrade`, the Airflow operators and DAGs and the Savepoints page share them."""
