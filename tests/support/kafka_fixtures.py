"""Kafka fixtures: ONE embedded broker per pytest session (`kafka`); each test makes its own topics (`new_topic`)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from devtools.kafka import EmbeddedKafka


@pytest.fixture(scope="session")
def kafka() -> Iterator[EmbeddedKafka]:
    with EmbeddedKafka() as broker:
        yield broker


@pytest.fixture
def new_topic(kafka: EmbeddedKafka, request: pytest.FixtureRequest) -> Callable[..., str]:
    """new_topic(partitions=1, config=None) -> the name of a topic created for this test alone."""

    def create(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        legal = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name[:40])  # Kafka's topic name characters
        name = f"{legal}-{uuid.uuid4().hex[:8]}"
        kafka.create_topic(name, partitions, config)
        return name

    return create
