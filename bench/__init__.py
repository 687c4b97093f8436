"""Benchmarks of the snapshot engine against peer tools (`make bench`)."""
