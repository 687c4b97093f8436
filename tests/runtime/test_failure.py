"""A failure's message carries its JVM root cause (spark_jobs/runtime/failure.py): the status and the log
then say what really broke behind a wrapper such as CANNOT_LOAD_CHECKPOINT_FILE_MANAGER."""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.runtime.failure import describe, root_cause


@dataclass
class _Java:
    """Stands in for a py4j JavaObject of a Throwable: getCause() and toString()."""

    text: str
    cause: _Java | None = None

    def getCause(self) -> _Java | None:
        return self.cause

    def toString(self) -> str:
        return self.text


class _Py4JJavaError(Exception):
    def __init__(self, message: str, java: _Java) -> None:
        super().__init__(message)
        self.java_exception = java


def test_the_root_cause_is_named_after_the_message() -> None:
    chain = _Java("SparkException: CANNOT_LOAD", _Java("IOException: init", _Java("SdkClientException: refused")))
    failure = describe(_Py4JJavaError("[CANNOT_LOAD_CHECKPOINT_FILE_MANAGER.UNCATEGORIZED] Error loading", chain))
    assert failure.error_class == "CANNOT_LOAD_CHECKPOINT_FILE_MANAGER.UNCATEGORIZED"
    assert failure.message.splitlines()[0].endswith("(caused by: SdkClientException: refused)")
    assert root_cause(ValueError("plain")) is None and describe(ValueError("plain")).message == "plain"
