"""What the example windowed job must count, per (user, window): the events a feeder produced, against the rows of its
Delta table. For the end-to-end tests that assert per key and window, not only totals."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import KafkaFeeder
from spark_jobs.generate import FLUSH_USER, round_events

Window = tuple[str, float]  # (user, the window's start in epoch seconds)


class RecordingFeeder(KafkaFeeder):
    """The example job's Kafka feeder, keeping every distinct event it produced."""

    def __init__(self, kafka: EmbeddedKafka, topic: str) -> None:
        super().__init__(kafka, topic)
        self.fed: list[dict[str, object]] = []

    def round(self) -> None:
        self.fed += round_events(self.rounds, self.events_per_round)
        super().round()

    def expected(self) -> Counter[Window]:
        """Events per (user, one-minute window)."""
        counted: Counter[Window] = Counter()
        for event in self.fed:
            moment = datetime.fromisoformat(str(event["event_time"]).replace("Z", "+00:00")).timestamp()
            counted[(str(event["user"]), moment - moment % 60)] += 1
        return counted


def counted(rows: list[dict[str, object]]) -> Counter[Window]:
    """Events per (user, window) in the table's rows (the flush marker's left out)."""
    found: Counter[Window] = Counter()
    for row in rows:
        if row["user"] == FLUSH_USER:
            continue
        start = row["window_start"]
        assert isinstance(start, datetime)
        moment = start if start.tzinfo else start.replace(tzinfo=UTC)
        found[(str(row["user"]), moment.timestamp())] += int(row["events"])  # type: ignore[call-overload]
    return found


def differences(expected: Counter[Window], found: Counter[Window]) -> str:
    """What is missing and what is counted twice, per (user, window); "" when every one is exact."""
    missing = {key: n - found[key] for key, n in expected.items() if found[key] < n}
    extra = {key: found[key] - expected[key] for key in found if found[key] > expected[key]}
    return f"missing {missing}, counted twice {extra}" if missing or extra else ""
