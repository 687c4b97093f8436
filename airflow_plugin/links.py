"""Operator extra links. The worker computes them after the task ran, from the task's own XCom
(its return value), so they point at exactly the deployment and snapshot that task produced."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from airflow.sdk import BaseOperator, BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom

UI_PREFIX = "/savepoints"  # the plugin's page (plugin.py serves it)


def snapshot_page_url(job: str, snapshot_id: str) -> str:
    """The savepoints page, opened at one snapshot."""
    return f"{UI_PREFIX}/?{urlencode({'job': job, 'snapshot': snapshot_id})}"


def _returned(ti_key: Any) -> dict[str, Any]:
    value = XCom.get_value(ti_key=ti_key, key="return_value")
    return value if isinstance(value, dict) else {}


class SparkUILink(BaseOperatorLink):
    """The Spark UI of the deployment the task deployed (empty when the job runs with the UI disabled)."""

    name = "Spark UI"

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        return str(_returned(ti_key).get("spark_ui") or "")


class SnapshotLink(BaseOperatorLink):
    """The snapshot the task took (or checked) on the savepoints page."""

    name = "Snapshot"

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        value = _returned(ti_key)
        snapshot = value.get("snapshot") if isinstance(value.get("snapshot"), dict) else value
        if not snapshot.get("id") or not snapshot.get("job"):
            return ""
        return snapshot_page_url(snapshot["job"], snapshot["id"])
