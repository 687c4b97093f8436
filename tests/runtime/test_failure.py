"""A failure's message carries its JVM root cause (spark_jobs/runtime/failure.py): the status and the log
then say what really broke behind a wrapper such as CANNOT_LOAD_CHECKPOINT_FILE_MANAGER."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import pytest
from py4j.clientserver import ClientServer, JavaParameters, PythonParameters
from py4j.java_gateway import GatewayParameters, JavaGateway

from airflow_plugin.core.records.deployment import JVM_GONE
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


def test_a_jvm_gone_from_under_the_python_process_is_named_so_whichever_py4j_client_saw_it() -> None:
    """A YARN kill signals the driver's JVM and its Python process at once: Python's next py4j call finds no JVM.
    Both py4j clients are made to call a port where no JVM listens (pyspark's pinned-thread ClientServer lets the
    bare ConnectionRefusedError through; the classic gateway wraps it)."""
    probe = socket.socket()  # bound and never listening, kept so for the test: the port refuses, nobody takes it
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    clients = [
        lambda: JavaGateway(gateway_parameters=GatewayParameters(port=port)),
        lambda: ClientServer(java_parameters=JavaParameters(port=port), python_parameters=PythonParameters(port=0)),
    ]
    for make in clients:
        client = make()
        try:
            with pytest.raises(Exception) as raised:
                client.jvm.System.currentTimeMillis()
        finally:
            client.shutdown()
        failure = describe(raised.value)
        assert failure.error_class == JVM_GONE and "went away" in failure.message, (type(raised.value), failure)
    # a connection refused anywhere else (the job's own code, a library) is the job's failure, named by its class
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5)
    except ConnectionRefusedError as exc:
        assert describe(exc).error_class == "ConnectionRefusedError"
    else:
        pytest.fail(f"port {port} was expected closed")
    finally:
        probe.close()
