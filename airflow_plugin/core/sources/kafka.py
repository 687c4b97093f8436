"""Kafka sources: the positions a snapshot holds, and whether the broker still holds the records after them.

A Kafka source logs per topic and partition the NEXT offset to read: a query restored from batch N asks
the broker for exactly those offsets. If retention has deleted them meanwhile (the position is below the
partition's earliest offset), Spark learns it only after the restored query started, and then fails
(`failOnDataLoss=true`, the default) or silently skips to the earliest offset (`false`). So before any
restore the engine asks the broker itself (`Broker.watermarks`) and compares (`compare`, pure):

    ok           earliest <= position <= latest: every record after the snapshot is still there
    expired      position < earliest: (earliest - position) records are gone
    beyond-end   position > latest: the topic was deleted and recreated, or truncated
    gone         the topic or partition no longer exists
    added        a partition created after the snapshot: Spark reads it from its earliest offset, so its
                 first `earliest` records are gone unless that is 0

Anything but ok (and added from 0) makes the snapshot unrestorable without losing records.

The broker's address and client settings: `KafkaSettings`, resolved once per job (core/jobs/context.py). The
client is confluent-kafka, imported only when a broker is asked (the `kafka` extra)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..errors import BrokerUnavailable
from . import KAFKA, SourcePosition, positions

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
# How a job's driver gets the broker its job declares (`kafka` in the jobs file), never on the job's command line
# (a script's own strict argparse refuses an argument it did not ask for): in its environment, which a local or
# client-mode driver gets, and in its Spark conf, which reaches a driver in a cluster's container too
# (spark_jobs/runtime/broker.py reads both). The variable is the engine's own setting as well: it wins over the
# jobs file's `kafka` table (core/jobs/context.py), so a driver's and the engine's broker are one.
KAFKA_ENV = "SAVEPOINTS_KAFKA_BOOTSTRAP"
KAFKA_CONF = "spark.savepoints.kafka.bootstrapServers"
_SECRET = re.compile(r"password|secret|token|jaas|credential|key\.pem", re.IGNORECASE)

Watermarks = Mapping[str, Mapping[int, tuple[int, int]] | None]  # topic -> partition -> (earliest, latest); None: gone


@dataclass(frozen=True)
class KafkaSettings:
    """Where the broker is and how to talk to it: `bootstrap_servers` plus any client settings
    (librdkafka names, e.g. `security.protocol`, `sasl.mechanism`). Secret values never show in its repr."""

    bootstrap_servers: str
    config: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __repr__(self) -> str:
        shown = {k: ("***" if _SECRET.search(k) else v) for k, v in self.config.items()}
        return f"KafkaSettings({self.bootstrap_servers!r}, config={shown}, timeout_s={self.timeout_s})"

    def client_config(self) -> dict[str, Any]:
        return {**self.config, "bootstrap.servers": self.bootstrap_servers, "logger": log}


def kafka_positions(version: int, lines: Sequence[str]) -> list[SourcePosition]:
    """The Kafka sources' positions among an offsets log's source lines."""
    return [p for p in positions(version, lines) if p.kind == KAFKA]


def topics_of(kafka: Iterable[SourcePosition]) -> set[str]:
    return {topic for p in kafka for topic in p.offset}


class PartitionState(StrEnum):
    OK = "ok"
    EXPIRED = "expired"
    BEYOND_END = "beyond-end"
    GONE = "gone"
    ADDED = "added"


@dataclass(frozen=True)
class PartitionCheck:
    """One partition: the snapshot's position (None for a partition added since), and the broker's
    earliest and latest offsets now (None when the partition is gone)."""

    source: str
    topic: str
    partition: int
    offset: int | None
    earliest: int | None
    latest: int | None
    state: PartitionState

    @property
    def lost(self) -> int | None:
        """Records a restore would never read: a count, or None when the broker cannot tell (gone, beyond end)."""
        if self.state is PartitionState.EXPIRED and self.offset is not None and self.earliest is not None:
            return self.earliest - self.offset
        if self.state is PartitionState.ADDED:
            return self.earliest or 0
        if self.state is PartitionState.OK:
            return 0
        return None

    @property
    def problem(self) -> bool:
        return self.state is not PartitionState.OK and self.lost != 0

    def describe(self) -> str:
        name = f"{self.topic}-{self.partition}"
        if self.state is PartitionState.EXPIRED:
            return (
                f"{name}: the snapshot resumes at offset {self.offset}, but the broker's earliest offset is "
                f"{self.earliest}: {self.lost} records are gone"
            )
        if self.state is PartitionState.GONE:
            return f"{name}: the partition no longer exists (everything after offset {self.offset} is gone)"
        if self.state is PartitionState.BEYOND_END:
            return (
                f"{name}: the snapshot resumes at offset {self.offset}, beyond the partition's end ({self.latest}): "
                "the topic was deleted and recreated, or truncated"
            )
        if self.state is PartitionState.ADDED:
            start = f"{self.earliest}, so its first {self.lost} records are gone" if self.lost else "0: nothing is lost"
            return f"{name}: a partition added after the snapshot; Spark reads it from its earliest offset, {start}"
        return f"{name}: offset {self.offset} is held (earliest {self.earliest}, latest {self.latest})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "earliest": self.earliest,
            "latest": self.latest,
            "state": str(self.state),
            "lost": self.lost,
        }


@dataclass(frozen=True)
class SourceCheck:
    """A snapshot's Kafka positions against the broker. `checked` False: nothing could be compared (no broker
    known, or it did not answer), `note` says why."""

    bootstrap_servers: str | None
    partitions: tuple[PartitionCheck, ...] = ()
    checked: bool = True
    note: str = ""

    @property
    def problems(self) -> list[PartitionCheck]:
        return [p for p in self.partitions if p.problem]

    @property
    def restorable(self) -> bool:
        return self.checked and not self.problems

    @property
    def records_lost(self) -> int:
        """Records known to be gone (partitions that are gone altogether add an unknown number: see `problems`)."""
        return sum(p.lost or 0 for p in self.problems)

    @property
    def lost_unknown(self) -> bool:
        return any(p.lost is None for p in self.problems)

    def summary(self) -> str:
        """One line: 'ok', or how many records are gone where."""
        if not self.checked:
            return f"unchecked: {self.note}"
        if not self.problems:
            added = [f"{p.topic}-{p.partition}" for p in self.partitions if p.state is PartitionState.ADDED]
            since = f" (added since, read from offset 0: {', '.join(added)})" if added else ""
            return f"ok: every record after the snapshot is still in Kafka{since}"
        lost = f"{self.records_lost} records" + (" and more" if self.lost_unknown else "")
        where = ", ".join(f"{p.topic}-{p.partition}" for p in self.problems)
        return f"{lost} gone from Kafka ({where})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "restorable": self.restorable,
            "records_lost": self.records_lost,
            "lost_unknown": self.lost_unknown,
            "summary": self.summary(),
            "bootstrap_servers": self.bootstrap_servers,
            "partitions": [p.to_dict() for p in self.partitions],
            "note": self.note,
        }


def compare(kafka: Iterable[SourcePosition], watermarks: Watermarks, bootstrap: str | None = None) -> SourceCheck:
    """Pure: each partition of each Kafka source position against what the broker holds now."""
    checks: list[PartitionCheck] = []
    for position in kafka:
        for topic, partitions in sorted(position.offset.items()):
            held = watermarks.get(topic)
            logged = {int(p): int(offset) for p, offset in partitions.items()}
            for partition, offset in sorted(logged.items()):
                if held is None or partition not in held:
                    state, earliest, latest = PartitionState.GONE, None, None
                else:
                    earliest, latest = held[partition]
                    state = PartitionState.OK
                    if offset < earliest:
                        state = PartitionState.EXPIRED
                    elif offset > latest:
                        state = PartitionState.BEYOND_END
                checks.append(PartitionCheck(position.source, topic, partition, offset, earliest, latest, state))
            for partition in sorted(set(held or {}) - set(logged)):
                earliest, latest = (held or {})[partition]
                checks.append(
                    PartitionCheck(position.source, topic, partition, None, earliest, latest, PartitionState.ADDED)
                )
    return SourceCheck(bootstrap, tuple(checks))


def unchecked(note: str, bootstrap: str | None = None) -> SourceCheck:
    return SourceCheck(bootstrap, (), checked=False, note=note)


class Broker:
    """Asks one Kafka cluster for its partitions' earliest and latest offsets (confluent-kafka's AdminClient)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._admin: Any = None

    def _client(self) -> Any:
        if self._admin is None:
            try:
                from confluent_kafka.admin import AdminClient
            except ImportError:
                raise BrokerUnavailable(
                    "checking Kafka offsets needs the confluent-kafka package: install the project's kafka extra "
                    "(pip install 'spark-savepoints[kafka]')"
                ) from None
            self._admin = AdminClient(self.settings.client_config())
        return self._admin

    def _unreachable(self, exc: BaseException) -> BrokerUnavailable:
        return BrokerUnavailable(
            f"Kafka broker {self.settings.bootstrap_servers} did not answer within {self.settings.timeout_s:.0f}s "
            f"({exc}): check that it runs and the job's kafka bootstrap_servers (jobs file, "
            "$SAVEPOINTS_KAFKA_BOOTSTRAP or the Airflow Kafka connection); nothing was changed"
        )

    def watermarks(self, topics: Iterable[str]) -> dict[str, dict[int, tuple[int, int]] | None]:
        """topic -> partition -> (earliest, latest offset) now; None for a topic that does not exist."""
        admin = self._client()  # first: without the client library, the error that names the extra
        from confluent_kafka import KafkaError, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        timeout = self.settings.timeout_s
        found: dict[str, dict[int, tuple[int, int]] | None] = {}
        wanted: list[TopicPartition] = []
        try:
            for topic in sorted(set(topics)):
                described = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
                error = described.error if described is not None else None
                if described is None or (error and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                    found[topic] = None
                    continue
                if described.error:
                    raise KafkaException(described.error)
                found[topic] = {}
                wanted += [TopicPartition(topic, p) for p in sorted(described.partitions)]
            ends = {}
            for name, spec in (("earliest", OffsetSpec.earliest()), ("latest", OffsetSpec.latest())):
                futures = admin.list_offsets({tp: spec for tp in wanted}, request_timeout=timeout) if wanted else {}
                ends[name] = {(tp.topic, tp.partition): f.result(timeout=timeout).offset for tp, f in futures.items()}
        except KafkaException as exc:
            raise self._unreachable(exc) from None
        for tp in wanted:
            key = (tp.topic, tp.partition)
            held = found[tp.topic]
            assert held is not None
            held[tp.partition] = (ends["earliest"][key], ends["latest"][key])
        return found

    def offsets_for_times(self, partitions: Iterable[tuple[str, int]], timestamp_ms: int) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the offset of its first record whose Kafka timestamp is at or after
        `timestamp_ms` (the partition's latest offset when none is): Kafka's offsets-for-times."""
        admin = self._client()
        from confluent_kafka import KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        wanted = [TopicPartition(topic, partition) for topic, partition in sorted(set(partitions))]
        timeout = self.settings.timeout_s
        found: dict[tuple[str, int], int] = {}
        try:
            for spec in (OffsetSpec.for_timestamp(timestamp_ms), OffsetSpec.latest()):
                futures = admin.list_offsets({tp: spec for tp in wanted}, request_timeout=timeout) if wanted else {}
                for tp, future in futures.items():
                    offset = future.result(timeout=timeout).offset
                    if offset >= 0 and (tp.topic, tp.partition) not in found:
                        found[(tp.topic, tp.partition)] = offset  # -1: no record that late: the latest
        except KafkaException as exc:
            raise self._unreachable(exc) from None
        return found

    def check(self, kafka: Sequence[SourcePosition]) -> SourceCheck:
        return compare(kafka, self.watermarks(topics_of(kafka)), self.settings.bootstrap_servers)
