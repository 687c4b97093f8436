"""Metrics for Prometheus (`savepoints metrics`, the plugin's `/savepoints/metrics`): observe, then render.
`figures.py` reads the store into plain figures; `openmetrics.py` turns them into metric families."""

from .figures import Figures, observe
from .openmetrics import CONTENT_TYPE, render

__all__ = ["CONTENT_TYPE", "Figures", "observe", "render"]
