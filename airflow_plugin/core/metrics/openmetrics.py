"""The figures (figures.py) as metrics for Prometheus, in OpenMetrics text, with prometheus_client. Names follow
Prometheus' rules: base units (seconds, bytes), `_total` for counters, labels `job`, `deployment`, `version` (and
`kind`, `state`, `operator`, `operation`, `store` where a figure needs them). The documented list with the alert
rules: docs/operations.md, "Metrics and alerts"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from ..records.deployment import State
from ..timestamps import epoch_of
from .figures import Figures

CONTENT_TYPE = CONTENT_TYPE_LATEST  # OpenMetrics 1.0
STATES = tuple(s.value for s in State)


def _gauge(name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


class _FiguresCollector(Collector):
    def __init__(self, figures: Figures) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        yield from families(self.figures)


def families(figures: Figures) -> list[Metric]:
    """The metric families of these figures (names and help texts: docs/operations.md)."""
    dep = ["job", "deployment", "version"]
    up = _gauge("savepoints_job_up", "1 if the job's store could be read for this scrape, else 0", ["job"])
    state = _gauge(
        "savepoints_deployment_state", "1 for the deployment's current state, 0 for the others", [*dep, "state"]
    )
    heartbeat = _gauge(
        "savepoints_deployment_heartbeat_age", "Seconds since the deployment's last heartbeat", dep, "seconds"
    )
    driver = _gauge(
        "savepoints_deployment_driver_visible",
        "1 if the scraping process can see whether the driver's process runs (same boot and PID namespace), else 0",
        dep,
    )
    batch = _gauge("savepoints_deployment_last_committed_batch", "The last batch the query committed", dep)
    duration = _gauge("savepoints_deployment_batch_duration", "How long the last batch took", dep, "seconds")
    rate = _gauge("savepoints_deployment_rows_per_second", "Input rows per second over the last minute", dep)
    rows = CounterMetricFamily(
        "savepoints_deployment_input_rows", "Input rows this run of the query processed", labels=dep
    )
    lag = _gauge(
        "savepoints_deployment_kafka_lag_records",
        "Records the most lagging Kafka partition is behind the latest offset (Spark's maxOffsetsBehindLatest)",
        dep,
    )
    state_rows = _gauge(
        "savepoints_deployment_state_rows", "Rows in an operator's state (Spark's progress)", [*dep, "operator"]
    )
    gate_role = _gauge(
        "savepoints_deployment_gate", "1 for a gated deployment's role in a blue/green upgrade", [*dep, "role"]
    )
    gate_dropped = _gauge(
        "savepoints_deployment_gate_dropped_rows",
        "Rows a gated (blue) deployment left to the other version since its gate was set: not in its output",
        dep,
    )
    restarts = CounterMetricFamily(
        "savepoints_reconcile_restarts", "Restarts `savepoints apply` made of the declared job", labels=["job"]
    )
    restarts_left = _gauge(
        "savepoints_reconcile_restarts_left",
        "Restarts left in the declared job's budget (restart.attempts in restart.window); 0: a failure stays",
        ["job"],
    )
    desired = _gauge(
        "savepoints_reconcile_desired_running", "1 if the declared job runs its declared version, else 0", ["job"]
    )
    scale_size = _gauge(
        "savepoints_autoscale_size", "The size the job runs at on its autoscaler's knob (cores or executors)", ["job"]
    )
    recommended = _gauge(
        "savepoints_autoscale_recommended_size", "The size the autoscaler's last recommendation gives the job", ["job"]
    )
    scale_max = _gauge(
        "savepoints_autoscale_max_size", "The largest size the autoscaler may give the job (autoscale.max)", ["job"]
    )
    behind = _gauge(
        "savepoints_autoscale_behind_at_max",
        "1 if the autoscaler's last recommendation found the job falling behind at its max size, else 0",
        ["job"],
    )
    rescales = CounterMetricFamily(
        "savepoints_autoscale_rescales", "Rescales the autoscaler began, as its record keeps them", labels=["job"]
    )
    looked = _gauge(
        "savepoints_autoscale_recommendation_age",
        "Seconds since the autoscaler's last recommendation (each `savepoints apply` of the running job makes one)",
        ["job"],
        "seconds",
    )
    held = _gauge(
        "savepoints_autoscale_scale_up_held",
        "1 if scale-ups are held after an ineffective one (`savepoints apply JOB --retry` clears it), else 0",
        ["job"],
    )
    snap = ["job", "kind"]
    age = _gauge(
        "savepoints_last_snapshot_age", "Seconds since the newest COMPLETED snapshot completed", snap, "seconds"
    )
    snap_batch = _gauge("savepoints_last_snapshot_batch", "The batch of the newest COMPLETED snapshot", snap)
    size = _gauge(
        "savepoints_last_snapshot_size", "Bytes of the checkpoint files the newest snapshot holds", snap, "bytes"
    )
    uploaded = _gauge(
        "savepoints_last_snapshot_uploaded", "Bytes the newest snapshot stored anew (not held before)", snap, "bytes"
    )
    snap_rows = _gauge(
        "savepoints_last_snapshot_state_rows", "Rows in an operator's state at the newest snapshot", [*snap, "operator"]
    )
    snap_state = _gauge(
        "savepoints_last_snapshot_state_size",
        "Bytes of an operator's state files at the newest snapshot",
        [*snap, "operator"],
        "bytes",
    )
    period = _gauge(
        "savepoints_snapshot_period", "How often a snapshot of this kind is expected (the jobs file)", snap, "seconds"
    )
    failed = _gauge("savepoints_failed_snapshots", "FAILED snapshots the store holds for the job", ["job"])
    failed_at = _gauge(
        "savepoints_last_failed_snapshot_timestamp", "When the newest FAILED snapshot failed", ["job"], "seconds"
    )
    lease = ["job", "operation"]
    lease_age = _gauge("savepoints_lease_age", "Seconds since the job's lease was acquired", lease, "seconds")
    lease_ttl = _gauge("savepoints_lease_ttl", "The lease's time to live: renewed every third of it", lease, "seconds")
    lease_expired = _gauge("savepoints_lease_expired", "1 if the lease expired without being released", lease)
    store = ["store"]
    # a store's figures are measured by each prune (a scrape lists nothing): as of savepoints_store_usage_timestamp
    as_of = "when the last prune measured them (savepoints_store_usage_timestamp_seconds)"
    store_bytes = _gauge("savepoints_store_size", f"Bytes of stored contents (blobs and packs) {as_of}", store, "bytes")
    store_objects = _gauge("savepoints_store_objects", f"Stored content objects (blobs and packs) {as_of}", store)
    orphans = _gauge(
        "savepoints_store_unreferenced_size",
        f"Bytes no snapshot references, awaiting garbage collection, {as_of}",
        store,
        "bytes",
    )
    measured = _gauge(
        "savepoints_store_usage_timestamp", "When the last prune measured the store's usage", store, "seconds"
    )
    scrape = _gauge("savepoints_scrape_duration", "How long reading the store for these metrics took", [], "seconds")

    for job in figures.jobs:
        up.add_metric([job.job], 0 if job.error else 1)
        for d in job.deployments:
            labels = [job.job, d.deployment, d.version]
            for name in STATES:
                state.add_metric([*labels, name], 1 if d.state == name else 0)
            s = d.status
            if d.heartbeat_age_s is not None:
                heartbeat.add_metric(labels, d.heartbeat_age_s)
            if d.driver is not None:
                driver.add_metric(labels, 0 if d.driver == "cannot tell" else 1)
            if s is None:
                continue
            _maybe(batch, labels, s.last_batch_id)
            _maybe(duration, labels, s.batch_duration_ms / 1000 if s.batch_duration_ms is not None else None)
            _maybe(rate, labels, s.rows_per_second if s.rows_per_second is not None else s.processed_rows_per_second)
            _maybe(rows, labels, s.input_rows_total)
            _maybe(lag, labels, s.kafka_lag)
            for index, op in enumerate(s.state_operators or []):
                _maybe(state_rows, [*labels, _operator(index, op)], op.get("rows"))
            if s.gate and s.gate.get("role"):
                gate_role.add_metric([*labels, str(s.gate["role"])], 1)
                gate_dropped.add_metric(labels, float(s.gate.get("dropped") or 0))
        for kind, last in sorted(job.last.items()):
            labels = [job.job, kind]
            age.add_metric(labels, last.age_s)
            _maybe(snap_batch, labels, last.batch_id)
            size.add_metric(labels, last.bytes)
            uploaded.add_metric(labels, last.uploaded_bytes)
            for op in last.state:
                operator = _operator(op.get("id", 0), op)
                _maybe(snap_rows, [*labels, operator], op.get("rows"))
                _maybe(snap_state, [*labels, operator], op.get("bytes"))
        for kind, seconds in sorted(job.periods.items()):
            period.add_metric([job.job, kind], seconds)
        if not job.error:
            failed.add_metric([job.job], job.failed)
        _maybe(failed_at, [job.job], job.last_failed_at)
        _maybe(restarts, [job.job], job.restarts)
        _maybe(restarts_left, [job.job], job.restarts_left)
        _maybe(desired, [job.job], None if job.desired_running is None else int(job.desired_running))
        if job.autoscale is not None:
            _autoscaled(job.job, job.autoscale, scale_size, recommended, scale_max, behind, rescales, held, looked)
        if job.lease:
            labels = [job.job, job.lease["operation"]]
            lease_age.add_metric(labels, job.lease["age_s"])
            lease_ttl.add_metric(labels, job.lease["ttl_s"])
            lease_expired.add_metric(labels, 1 if job.lease["expired"] else 0)
    for usage in figures.stores:
        store_bytes.add_metric([usage.store], usage.bytes)
        store_objects.add_metric([usage.store], usage.objects)
        orphans.add_metric([usage.store], usage.unreferenced_bytes)
        measured.add_metric([usage.store], epoch_of(usage.measured_at))
    scrape.add_metric([], figures.seconds)
    return [
        up, state, heartbeat, driver, batch, duration, rate, rows, lag, state_rows, gate_role, gate_dropped, age,
        snap_batch, size, uploaded, snap_rows, snap_state, period, failed, failed_at, restarts, restarts_left, desired,
        scale_size, recommended, scale_max, behind, rescales, held, looked, lease_age, lease_ttl, lease_expired,
        store_bytes, store_objects, orphans, measured, scrape,
    ]  # fmt: skip


def _autoscaled(
    job: str,
    autoscale: dict[str, Any],
    size: GaugeMetricFamily,
    recommended: GaugeMetricFamily,
    most: GaugeMetricFamily,
    behind: GaugeMetricFamily,
    rescales: CounterMetricFamily,
    held: GaugeMetricFamily,
    looked: GaugeMetricFamily,
) -> None:
    """A job's autoscaler: its size and recommendation are absent while nothing runs or before a first one (not 0:
    an alert on them would fire on a stopped job); the others are always there."""
    recommendation = autoscale.get("recommendation") or {}
    _maybe(size, [job], autoscale.get("size"))
    _maybe(recommended, [job], recommendation.get("size"))
    most.add_metric([job], autoscale["max"])
    behind.add_metric([job], 1 if recommendation.get("behind_at_max") else 0)
    rescales.add_metric([job], autoscale["rescales"])
    held.add_metric([job], 1 if autoscale.get("scale_up_held") else 0)
    _maybe(looked, [job], autoscale.get("recommendation_age_s"))


def _operator(index: int, op: dict[str, Any]) -> str:
    """An operator's label: its id and Spark's name for it (`0:stateStoreSave`), stable across batches."""
    name = op.get("name") or ""
    return f"{index}:{name}" if name else str(index)


def _maybe(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))


def render(figures: Figures) -> bytes:
    """OpenMetrics text (ends with `# EOF`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FiguresCollector(figures))
    return generate_latest(registry)
