"""A migration run (`--migration`, the engine's airflow_plugin/core/upgrades/migration.py): instead of running
the job, turn the old version's state into this version's initial state and check it.

1. The function named in the jobs file (`migrate = "package.module:function"`) is imported and called with an
   `OldState`: the old checkpoint's state at the snapshot's batch, read with Spark's state data source.
2. What it returns is checked against what this version takes (`StreamingJob.initial_state`, initial.py):
   the same columns and types, no null key, no key twice; then written as Parquet to the run's output.
3. This version's own query runs its first batch only (the noop sink) on the run's throwaway checkpoint,
   seeded at the snapshot's positions (seed.py: that batch reads nothing) with that initial state; its state
   is read back and compared with what the function returned, variable by variable.
Any failure is a MigrationFailed naming the function and the column or key; nothing of the running deployment
is touched (the engine runs this on copies).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.tools.state_reader import read_state, state_reads

from .initial import InitialState

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

MIGRATION_FAILED = "MIGRATION_FAILED"
_VARIABLE = "var:"  # state_check's label of a transformWithState variable
_SHOWN = 3  # offending keys named in an error


class MigrationFailed(Exception):
    """The migration cannot give this version its initial state: the message names the function and why."""

    error_class = MIGRATION_FAILED

    def __init__(self, function: str, problem: str) -> None:
        super().__init__(f"migration function {function}: {problem}")


@dataclass(frozen=True)
class StateOperator:
    """One stateful operator's store in the old checkpoint (Spark's `state-metadata`)."""

    id: int
    name: str  # Spark's: stateStoreSave (an aggregation), dedupeWithinWatermark, transformWithStateExec, ...
    store: str
    variables: list[str]  # a transformWithState's state variables; [] for other operators


class OldState:
    """What a migration function receives: the old version's state at the snapshot's batch."""

    def __init__(self, spark: SparkSession, checkpoint: str, batch_id: int) -> None:
        self.spark, self.checkpoint, self.batch_id = spark, checkpoint, batch_id
        operators: list[StateOperator] = []
        for row in spark.read.format("state-metadata").load(checkpoint).collect():
            labels = [label for label, _ in state_reads(row)]
            variables = [label.removeprefix(_VARIABLE) for label in labels if label.startswith(_VARIABLE)]
            operator = StateOperator(int(row.operatorId), str(row.operatorName), str(row.stateStoreName), variables)
            operators.append(operator)
        self.operators = operators

    def operator(self, operator: int | str) -> StateOperator:
        """The operator by id or by Spark's name (the first of that name)."""
        for candidate in self.operators:
            if operator in (candidate.id, candidate.name):
                return candidate
        known = ", ".join(f"{o.id} ({o.name})" for o in self.operators) or "none"
        raise KeyError(f"the old state has no operator {operator!r}: it has {known}")

    def read(self, operator: int | str, store: str | None = None, variable: str | None = None) -> DataFrame:
        """The operator's state rows (`key`, `value` structs; a transformWithState `variable`'s as Spark's state
        reader gives them), without Spark's partition column."""
        found = self.operator(operator)
        options = {"operatorId": str(found.id)}
        if store and store != "default":
            options["storeName"] = store
        if variable is not None:
            if variable not in found.variables:
                known = ", ".join(found.variables) or "none"
                raise KeyError(f"operator {found.id} ({found.name}) has no state variable {variable!r}: it has {known}")
            options["stateVarName"] = variable
        return read_state(self.spark, self.checkpoint, self.batch_id, options).drop("partition_id")


def load(function: str) -> Callable[[OldState], DataFrame]:
    """The function named "package.module:function"."""
    module_name, _, name = function.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise MigrationFailed(
            function,
            f"cannot be imported ({type(exc).__name__}: {exc}): ship its module with the job's application and "
            "check the name in the jobs file",
        ) from exc
    if not callable(found):
        raise MigrationFailed(function, f"{name} in {module_name} is not a function")
    return found


def call(function: str, migrate: Callable[[OldState], DataFrame], old: OldState) -> DataFrame:
    from pyspark.sql import DataFrame

    try:
        result = migrate(old)
    except Exception as exc:
        raise MigrationFailed(function, f"raised {type(exc).__name__}: {str(exc)[:500]}") from exc
    if not isinstance(result, DataFrame):
        raise MigrationFailed(function, f"returned {type(result).__name__}, not a DataFrame")
    return result


def check_schema(function: str, result: DataFrame, takes: InitialState) -> None:
    """The same columns and types as the version's initial state (nullability aside)."""
    got = {field.name: field.dataType for field in result.schema.fields}
    want = {field.name: field.dataType for field in takes.schema.fields}
    problems = [f"column {name} is missing" for name in want if name not in got]
    problems += [f"column {name} is not one the version takes" for name in got if name not in want]
    problems += [
        f"column {name} is {got[name].simpleString()}, the version takes {kind.simpleString()}"
        for name, kind in want.items()
        if name in got and got[name] != kind
    ]
    if problems:
        raise MigrationFailed(
            function, f"wrong schema: {'; '.join(problems)} (the version takes {takes.schema.simpleString()})"
        )


def check_keys(function: str, result: DataFrame, keys: list[str]) -> None:
    """No key column null, no key twice (transformWithState would merge or reject them silently)."""
    from pyspark.sql import functions as F

    for key in keys:
        nulls = result.where(F.col(key).isNull()).count()
        if nulls:
            raise MigrationFailed(function, f"{nulls} row(s) have a null key column {key}")
    duplicated = result.groupBy(*keys).count().where(F.col("count") > 1).limit(_SHOWN).collect()
    if duplicated:
        shown = "; ".join(", ".join(f"{k}={row[k]}" for k in keys) + f" ({row['count']} rows)" for row in duplicated)
        raise MigrationFailed(function, f"duplicate key(s) ({', '.join(keys)}): {shown}")


def _unwrapped(column: Column, kind: Any) -> Column:
    """A state reader's value as the initial state's column: a one-field struct's field, a list of them as an
    array of the field, sorted and empty as null (a list state keeps no empty list)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StructType

    if isinstance(kind, StructType) and len(kind.fields) == 1:
        return _unwrapped(column.getField(kind.fields[0].name), kind.fields[0].dataType)
    if isinstance(kind, ArrayType):
        element = kind.elementType
        if isinstance(element, StructType) and len(element.fields) == 1:
            column = F.transform(column, lambda item: item.getField(element.fields[0].name))
        return F.when(F.size(column) > 0, F.array_sort(column))
    return column


def compare(
    spark: SparkSession, checkpoint: str, batch_id: int, expected: DataFrame, takes: InitialState
) -> tuple[int, list[str]]:
    """Mismatching keys (a variable's value differs, or is on one side only) between the state of `checkpoint`'s
    transformWithState at `batch_id` and `expected`, and up to a few of them described."""
    from pyspark.sql import functions as F

    mismatches, shown = 0, []
    operators = [o for o in OldState(spark, checkpoint, batch_id).operators if o.variables]
    if len(operators) != 1:
        raise ValueError(f"expected one transformWithState operator in {checkpoint}, found {len(operators)}")
    for variable in takes.variables:
        stored = read_state(
            spark,
            checkpoint,
            batch_id,
            {"operatorId": str(operators[0].id), "stateVarName": variable, "flattenCollectionTypes": "false"},
        )
        value = next(name for name in stored.columns if name not in ("key", "partition_id"))
        got = stored.select(
            *(F.col("key").getField(k).alias(k) for k in takes.keys),
            _unwrapped(F.col(value), stored.schema[value].dataType).alias("got"),
        )
        returned = _unwrapped(F.col(variable), expected.schema[variable].dataType)
        want = expected.select(*takes.keys, returned.alias("want"))
        differing = want.join(got, takes.keys, "full_outer").where(~F.col("want").eqNullSafe(F.col("got")))
        count = differing.count()
        mismatches += count
        for row in differing.limit(_SHOWN).collect() if count else []:
            key = ", ".join(f"{k}={row[k]}" for k in takes.keys)
            shown.append(f"{variable} at {key}: returned {row['want']}, state holds {row['got']}")
    return mismatches, shown
