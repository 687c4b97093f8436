"""Managed jobs, one deployment's life: the jobs file, deployment records and their control channel, launching,
deploy, start-up, observing, health, stop, kill, rescale, a snapshot of a live deployment."""
