"""A transformWithState's initial state (`--initial-state`): what a migration function made (migration.py).

A job that takes one declares its shape, `StreamingJob(..., initial_state=InitialState(schema, keys))`: one
row per key, the key columns (transformWithState's grouping columns) then one column per state variable,
named like it (a value state: its value; a list state: an array). Its build passes `initial_state(spark)`
(None unless the runtime was given one) grouped by the keys to `transformWithState(initialState=...)`.
Spark applies it in the query's first batch only, so a restarted deployment is not initialised twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

# where the runner tells the job's build the location (a session conf: the build gets only the session)
INITIAL_STATE_CONF = "spark.savepoints.initialState"


@dataclass(frozen=True)
class InitialState:
    """The initial state a job takes: its schema and, of its columns, the keys."""

    schema: StructType
    keys: list[str]

    def __post_init__(self) -> None:
        unknown = [key for key in self.keys if key not in self.schema.fieldNames()]
        if unknown or not self.keys:
            schema = self.schema.simpleString()
            raise ValueError(f"InitialState keys {self.keys} must be some of its schema's columns: {schema}")

    @property
    def variables(self) -> list[str]:
        """The state variables: every column that is not a key."""
        return [name for name in self.schema.fieldNames() if name not in self.keys]


def initial_state(spark: SparkSession) -> DataFrame | None:
    """The initial state the runtime was given (`--initial-state`), or None."""
    location = spark.conf.get(INITIAL_STATE_CONF, None)
    return spark.read.parquet(location) if location else None
