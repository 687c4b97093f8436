"""Names that moved between the Airflow versions this package supports (3.1 to 3.x), imported once here.

Airflow 3.2+ (task SDK 1.2+) has the task exceptions in `airflow.sdk.exceptions` and the configuration in
`airflow.sdk.configuration`, where 3.1's task SDK 1.1 lacks them; there they are `airflow.exceptions`' and
`airflow.configuration`'s (which 3.2+ still serves, with a deprecation warning); Airflow's metrics are
`airflow.sdk.observability.stats` in 3.3 and `airflow.stats` before (3.3 still serves it, deprecated); the
timetables a DAG file names are the task SDK's in 3.2+ and `airflow.timetables`' in 3.1.
tests/e2e/test_wheel.py loads the DAGs and the plugin on Airflow 3.1.8."""

from __future__ import annotations

try:
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException
except ImportError:  # Airflow 3.1
    from airflow.exceptions import AirflowFailException, AirflowNotFoundException  # type: ignore[no-redef]

try:
    from airflow.sdk.configuration import conf
except ImportError:  # Airflow 3.1
    from airflow.configuration import conf  # type: ignore[no-redef]

try:
    from airflow.sdk.observability.stats import Stats
except ImportError:  # Airflow 3.1
    from airflow.stats import Stats  # type: ignore[no-redef]

try:
    from airflow.sdk import AssetOrTimeSchedule, DeltaTriggerTimetable
except ImportError:  # Airflow 3.1
    from airflow.timetables.assets import AssetOrTimeSchedule  # type: ignore[no-redef]
    from airflow.timetables.trigger import DeltaTriggerTimetable  # type: ignore[no-redef]

__all__ = [
    "AirflowFailException",
    "AirflowNotFoundException",
    "AssetOrTimeSchedule",
    "DeltaTriggerTimetable",
    "Stats",
    "conf",
]
