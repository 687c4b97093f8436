"""What a Kafka source subscribes to, and what a new version's subscription changes against a snapshot.

Spark describes a Kafka source in its progress as `KafkaV2[<strategy>]`: `Subscribe[a, b]`,
`SubscribePattern[orders-.*]` or `Assign[a-0, a-1]`. The pre-flight runs the new version and reads that
description (the job runtime reports it in its status), then compares it with the topics in the snapshot's
positions: Spark itself never checks it on the batch the pre-flight re-plans (its offsets are logged), only
on the first new batch after the cutover, when it is too late."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import SourcePosition
from .kafka import Broker, topics_of

_DESCRIPTION = re.compile(r"^KafkaV2\[(Subscribe|SubscribePattern|Assign)\[(.*)\]\]$")
_ASSIGNED = re.compile(r"^(.+)-(\d+)$")


@dataclass(frozen=True)
class Subscription:
    """What a Kafka source reads, from Spark's description of it (`KafkaV2[Subscribe[a, b]]`,
    `KafkaV2[SubscribePattern[orders-.*]]`, `KafkaV2[Assign[a-0, a-1]]`)."""

    kind: str  # Subscribe, SubscribePattern or Assign
    spec: str

    @classmethod
    def parse(cls, description: str) -> Subscription | None:
        match = _DESCRIPTION.match(description.strip())
        return cls(match[1], match[2]) if match else None

    def reads(self, topic: str) -> bool:
        if self.kind == "SubscribePattern":
            return re.search(self.spec, topic) is not None  # Spark's findFirstIn: a search, not a full match
        if self.kind == "Assign":
            return any((m := _ASSIGNED.match(tp)) and m[1] == topic for tp in self.spec.split(", "))
        return topic in self.spec.split(", ")

    @property
    def topics(self) -> set[str]:
        """The topics named outright (none for a pattern)."""
        if self.kind == "Subscribe":
            return set(self.spec.split(", "))
        if self.kind == "Assign":
            return {m[1] for tp in self.spec.split(", ") if (m := _ASSIGNED.match(tp))}
        return set()


@dataclass(frozen=True)
class TopicChange:
    """A topic a new version reads that the snapshot's positions lack (`added`), or one they hold that it
    no longer reads (`dropped`). Spark treats both as partitions appearing or disappearing: a dropped one as
    gone (KAFKA_DATA_LOSS.PARTITIONS_DELETED with failOnDataLoss=true), an added one read from its earliest
    offset (KAFKA_DATA_LOSS.ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO unless that is 0)."""

    topic: str
    change: str  # "added" or "dropped"
    earliest: dict[int, int] | None = None  # an added topic's earliest offsets; None: the topic does not exist

    @property
    def problem(self) -> bool:
        return self.change == "dropped" or self.earliest is None or any(self.earliest.values())

    def describe(self) -> str:
        if self.change == "dropped":
            return (
                f"the new version no longer reads topic {self.topic}: Spark takes its partitions for deleted and "
                "fails (KAFKA_DATA_LOSS.PARTITIONS_DELETED) unless failOnDataLoss=false, which drops them"
            )
        if self.earliest is None:
            return f"the new version reads topic {self.topic}, which does not exist"
        if not self.problem:
            return f"the new version also reads topic {self.topic}, from offset 0 (nothing is lost)"
        late = ", ".join(f"{self.topic}-{p} from {o}" for p, o in sorted(self.earliest.items()) if o)
        return (
            f"the new version also reads topic {self.topic}, whose earliest records are gone ({late}): Spark fails "
            "(KAFKA_DATA_LOSS.ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO) unless failOnDataLoss=false"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "change": self.change, "problem": self.problem, "detail": self.describe()}


def topic_changes(kafka: Sequence[SourcePosition], descriptions: Iterable[str], broker: Broker) -> list[TopicChange]:
    """What a new version's subscriptions (Spark's source descriptions from its pre-flight run) change
    against the snapshot's Kafka positions. Topics a pattern newly matches are not known here."""
    subscriptions = [s for d in descriptions if (s := Subscription.parse(d)) is not None]
    if not subscriptions:
        return []
    held = topics_of(kafka)
    dropped = sorted(t for t in held if not any(s.reads(t) for s in subscriptions))
    added = sorted(set().union(*(s.topics for s in subscriptions)) - held)
    marks = broker.watermarks(added) if added else {}
    changes = [TopicChange(topic, "dropped") for topic in dropped]
    for topic in added:
        partitions = marks.get(topic)
        earliest = {p: ends[0] for p, ends in partitions.items()} if partitions is not None else None
        changes.append(TopicChange(topic, "added", earliest))
    return changes
