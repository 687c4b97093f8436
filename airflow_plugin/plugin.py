"""The Airflow plugin, registered through the `airflow.plugins` entry point (pyproject.toml). Kept light:
every Airflow process imports it, and only the API server serves the savepoints page, so the page's app
(airflow_plugin/ui) is built on its first request."""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from .links import UI_PREFIX, SnapshotLink, SparkUILink


class SavepointsPage:
    """An ASGI app that builds the savepoints FastAPI app (airflow_plugin.ui.app) when first called."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from .ui.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class SavepointsPlugin(AirflowPlugin):
    name = "savepoints"
    operator_extra_links = [SnapshotLink(), SparkUILink()]
    fastapi_apps = [{"app": SavepointsPage(), "url_prefix": UI_PREFIX, "name": "Savepoints"}]
    external_views = [
        {
            "name": "Savepoints",
            "href": UI_PREFIX.lstrip("/") + "/",  # relative to Airflow's base URL
            "destination": "nav",
            "url_route": "savepoints",
            "nav_top_level": True,
            "icon": UI_PREFIX.lstrip("/") + "/static/icon.svg",  # the UI's <base> is Airflow's base URL
        }
    ]
