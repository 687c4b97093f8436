"""Managed jobs: the jobs file, deployments and their control channel, launching, deploy, stop, health,
rescale, pre-flight and upgrade."""
