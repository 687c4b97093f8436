"""The autoscaler of declared jobs (`autoscale = {...}` in the jobs file): it sizes a running job from the load its
runtime reports, and acts on the reconcile loop through the upgrade paths that already keep every record once.

    policy.py   what the jobs file declares, and the knob: the cores of a local master or the executors of a
                cluster, read from and applied to a job's master and Spark confs
    load.py     what the runtime reports of its load, bucketed in time (status.json `load`), and the figures
                a decision reads off a window of it: arrival and processing rates, utilisation, backlog, trend
    decide.py   the decision, pure: from the policy, the figures and the scaling history, a Recommendation
                (keep, scale up or down to a size, hold) with its reasons and the figures it used"""
