"""Declared jobs that heal themselves (the Flink Kubernetes Operator's reconcile loop): the jobs file says what
should run (`desired`: running or stopped, which version, how to upgrade to it, where a first start's state comes
from), and `savepoints apply` (the reconcile DAG) observes every declared job, plans one step per job as data
(plan.py), and carries it out through the ordinary operations under the job's lease (apply.py). What it decided
and did (restarts, the last stable version, a version that failed, a person's pause) is a record per job in the
store (record.py)."""
