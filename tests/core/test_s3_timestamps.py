"""S3's timestamps parsed by Python's ISO 8601 parser (a listing's LastModified: thousands a snapshot), with
botocore's own parser for anything else: the same instants either way."""

from __future__ import annotations

from datetime import UTC, datetime

from botocore.utils import parse_timestamp

from airflow_plugin.core.storage import S3Storage, open_storage
from airflow_plugin.core.storage.s3 import _timestamp


def test_iso_timestamps_and_http_dates_parse_to_the_instants_botocore_gives() -> None:
    for value in ("2026-11-29T12:47:10.000Z", "2026-11-29T12:47:10Z", "2026-11-29T12:47:10.123+00:00"):
        assert _timestamp(value) == parse_timestamp(value) and _timestamp(value).tzinfo is not None
    http = "Sun, 29 Nov 2026 12:47:10 GMT"  # a HEAD's Last-Modified
    assert _timestamp(http) == parse_timestamp(http) == datetime(2026, 11, 29, 12, 47, 10, tzinfo=UTC)
    assert _timestamp("2026-11-29T12:47:10") == datetime(2026, 11, 29, 12, 47, 10, tzinfo=UTC)  # no zone: UTC


def test_a_listing_and_a_stat_agree_on_mtime(s3_store: str) -> None:
    storage = open_storage(s3_store)
    assert isinstance(storage, S3Storage)
    storage.write("a", b"x")
    [listed] = list(storage.list())
    stat = storage.stat("a")
    assert stat is not None and int(listed.mtime) == int(stat.mtime)
