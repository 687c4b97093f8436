"""The engine is pure Python: importing it loads neither airflow nor pyspark (docs/architecture.md, layers)."""

from __future__ import annotations

import subprocess
import sys


def test_core_imports_neither_airflow_nor_pyspark() -> None:
    probe = (
        "import sys, pkgutil, importlib, airflow_plugin.core as core\n"
        "for m in pkgutil.walk_packages(core.__path__, 'airflow_plugin.core.'): importlib.import_module(m.name)\n"
        "import airflow_plugin.cli\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('airflow', 'pyspark')))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
