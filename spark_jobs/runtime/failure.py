"""What went wrong, as the engine shows it: Spark's error class (condition) and a message.

A failed streaming query surfaces as STREAM_FAILED wrapping the real cause, e.g.
`[STREAM_FAILED] Query [...] terminated with exception: [STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] ...`.
The wrapper's class says nothing, so the innermost named class is the one reported.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

from py4j.protocol import Py4JNetworkError

from airflow_plugin.core.records.deployment import JVM_GONE

WRAPPERS = frozenset({"STREAM_FAILED"})
MESSAGE_LIMIT = 4000  # characters of the message kept in status.json
_CONDITION = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]")
_JVM_STACK = "\n\nJVM stacktrace:"
_QUERY_DUMP = "\n=== Streaming Query ==="  # STREAM_FAILED appends the query's offsets and whole plan
_WRAPPED = "terminated with exception: "


@dataclass(frozen=True)
class Failure:
    error_class: str | None
    message: str


def _conditions(exc: BaseException) -> list[str]:
    """Conditions along the chain: pyspark's getCondition() where it has one, then every `[CLASS]` the
    messages name, outermost first (pyspark keeps the JVM cause chain in the message text)."""
    found: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        get_condition = getattr(current, "getCondition", None)
        if callable(get_condition):
            condition = get_condition()
            if condition:
                found.append(str(condition))
        found.extend(_CONDITION.findall(_first_part(str(current))))
        current = current.__cause__ or current.__context__
    return found


def _first_part(text: str) -> str:
    """The message without pyspark's appended JVM stack trace and the query dump (plans, offsets): the
    log has those; the status gets what a person reads first."""
    return text.split(_JVM_STACK, 1)[0].split(_QUERY_DUMP, 1)[0]


def root_cause(exc: BaseException) -> str | None:
    """The innermost JVM cause of a py4j or pyspark error (the last "Caused by", which Spark's own message
    often wraps out of sight: an S3A or network error behind CANNOT_LOAD_CHECKPOINT_FILE_MANAGER), or None."""
    cause, root = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None), None
    for _ in range(20):  # a cause chain is short; never loop on a cyclic one
        try:
            cause = cause.getCause() if cause is not None else None
        except Exception:  # not a Java object after all
            break
        if cause is None:
            break
        root = cause
    return str(root.toString()) if root is not None else None


def jvm_gone(exc: BaseException) -> bool:
    """Whether the failure is py4j losing its connection to the driver's JVM: py4j's network error, or a
    connection error raised in py4j itself (pyspark's pinned-thread client lets ConnectionRefusedError through)."""
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, Py4JNetworkError):
            return True
        if isinstance(current, ConnectionError) and current.__traceback__ is not None:
            innermost = traceback.extract_tb(current.__traceback__)[-1]
            if "/py4j/" in innermost.filename.replace("\\", "/"):
                return True
        # an explicit cause, else the exception handled when this one was raised, unless `raise ... from None`
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return False


def describe(exc: BaseException) -> Failure:
    """The first error class that is not a wrapper (the cause STREAM_FAILED names) and the cause's message,
    its first line naming the JVM root cause where there is one. The JVM gone from under the Python process
    is JVM_GONE: the process cannot say why (its cluster can)."""
    if jvm_gone(exc):
        return Failure(JVM_GONE, f"the driver's JVM went away under its Python process ({type(exc).__name__}: {exc})")
    conditions = _conditions(exc)
    named = [c for c in conditions if c not in WRAPPERS]
    error_class = (named or conditions or [type(exc).__name__])[0]
    message = _first_part(str(exc)).strip()
    if _WRAPPED in message:
        message = message.split(_WRAPPED, 1)[1]
    message = message or type(exc).__name__
    root = root_cause(exc)
    if root and root not in message.split("\n", 1)[0]:  # a JVM trace names it too, but far down
        first, _, rest = message.partition("\n")
        message = f"{first} (caused by: {root})" + (f"\n{rest}" if rest else "")
    return Failure(error_class, message[:MESSAGE_LIMIT])
