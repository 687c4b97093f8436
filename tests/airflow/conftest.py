"""Fixtures the savepoints page's tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI


@pytest.fixture(scope="session")
def airflow_app(airflow_db: Path) -> FastAPI:
    """Airflow's own API server app (core), with every plugin mounted; it also initialises the auth manager
    (which mints the tokens of tests/support/ui_support.py). Built once: it takes seconds."""
    from airflow.api_fastapi.app import create_app as create_airflow_app

    return create_airflow_app(apps="core")
