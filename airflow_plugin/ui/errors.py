"""Errors as the page shows them: a JSON body `{"error": message, "kind": ...}` with an HTTP status, never
a stack trace. The engine's messages already name the thing and the fix and carry no secret; anything
unexpected is logged here with its traceback and reaches the browser as its type only."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ..core.errors import (
    CheckpointError,
    ClusterUnavailable,
    IntegrityError,
    InvalidInput,
    NotFound,
    Refused,
    SavepointsError,
    StoreUnavailable,
    TimedOut,
)

log = logging.getLogger(__name__)

_STATUS: list[tuple[type[SavepointsError], int]] = [
    (InvalidInput, 400),
    (NotFound, 404),
    (Refused, 409),
    (CheckpointError, 422),
    (IntegrityError, 500),
    (StoreUnavailable, 503),
    (ClusterUnavailable, 503),
    (TimedOut, 504),
]


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def body(self) -> dict[str, str]:
        return {"error": self.message, "kind": self.kind}


def http_status(exc: SavepointsError) -> int:
    return next((code for cls, code in _STATUS if isinstance(exc, cls)), 500)


@contextmanager
def engine_errors(doing: str) -> Iterator[None]:
    """Turn whatever the engine raises while `doing` into an ApiError the page can show."""
    try:
        yield
    except ApiError:
        raise
    except SavepointsError as exc:
        raise ApiError(http_status(exc), str(exc), type(exc).__name__) from exc
    except Exception as exc:
        log.exception("savepoints page: unexpected error while trying to %s", doing)
        raise ApiError(
            500,
            f"unexpected {type(exc).__name__} while trying to {doing}: the API server's log has the details",
            "unexpected",
        ) from exc
