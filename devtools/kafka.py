"""A Kafka broker on 127.0.0.1 for tests and the demo: one KRaft JVM, broker and controller in one process.

with EmbeddedKafka() as kafka:                  # a fresh cluster in a temporary directory, free ports
    kafka.create_topic("events", partitions=2)
    kafka.produce("events", [b"a", b"b"], partition=0)
    kafka.delete_records("events", {0: 1})      # moves the log start offset, as retention would
    kafka.earliest_offsets("events")            # {0: 1, 1: 0}
    kafka.bootstrap                             # "127.0.0.1:<port>": Spark's kafka.bootstrap.servers

The broker's jars come from devtools/jvm.py (group kafka-broker), its Java from devtools/java.py. Its log goes
to <tmp>/broker.log; a broker that does not come up raises with the log's tail. stop() (and leaving the
`with`, also on Ctrl-C) ends the JVM: SIGTERM, then SIGKILL after STOP_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from devtools import java, jvm
from devtools.jvm_service import JvmService, without_stack_frames
from devtools.ports import free_ports

START_TIMEOUT_SECONDS = 120.0  # two JVMs (format, then the broker) on 2 busy cores
STOP_TIMEOUT_SECONDS = 20.0

# librdkafka's connection errors while the broker starts go to Python logging, not to stderr
_LOG = logging.getLogger(__name__)

_LOG4J2 = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
"""

Record = str | bytes | tuple[str | bytes | None, str | bytes]  # a value, or (key, value)


class KafkaError(RuntimeError):
    """The embedded broker failed to start, or a request to it failed."""


def _cluster_id() -> str:
    """A random Kafka cluster id: a UUID in URL-safe base64; Kafka refuses ids that start with '-'."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class EmbeddedKafka(JvmService):
    what = "the embedded Kafka broker"
    error = KafkaError
    dir_prefix = "embedded-kafka-"
    log_name = "broker.log"
    stop_timeout = STOP_TIMEOUT_SECONDS

    def __init__(
        self, broker_config: dict[str, str] | None = None, start_timeout: float = START_TIMEOUT_SECONDS
    ) -> None:
        """`broker_config` adds to or overrides the broker's server.properties (see _config)."""
        super().__init__(start_timeout)
        self.broker_config = broker_config or {}
        self.port = 0
        self._admin: Any = None

    # --- lifecycle ---

    def _java_command(self) -> list[str]:
        problem = java.java_problem()
        executable = java.java_executable()
        if problem or executable is None:
            raise KafkaError(f"the embedded Kafka broker needs Java: {problem}")
        return [
            executable,
            "-Xmx512m",
            "-XX:TieredStopAtLevel=1",  # C1 only: a test broker starts faster and needs no peak speed
            "-cp",
            os.pathsep.join(str(jar) for jar in jvm.classpath("kafka-broker")),
        ]

    def _launch(self, command: list[str]) -> bool:
        """Formats fresh storage and starts the broker; False when another process took one of its ports."""
        directory = self._started_dir
        data = directory / "data"
        shutil.rmtree(data, ignore_errors=True)
        self.port, controller_port = free_ports(2)
        config = directory / "server.properties"
        settings = {**self._config(data, controller_port), **self.broker_config}
        config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (directory / "log4j2.properties").write_text(_LOG4J2)
        command = [*command, f"-Dlog4j2.configurationFile={directory / 'log4j2.properties'}"]
        deadline = time.monotonic() + self.start_timeout
        try:
            formatted = subprocess.run(
                [*command, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config)],
                capture_output=True,
                text=True,
                timeout=self.start_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise KafkaError(f"formatting the embedded Kafka broker's storage took over {e.timeout:.0f} s") from None
        if formatted.returncode != 0:
            raise KafkaError(
                f"formatting the embedded Kafka broker's storage failed (exit {formatted.returncode}):\n"
                f"{without_stack_frames(formatted.stdout + formatted.stderr)}"
            )
        self._spawn([*command, "kafka.Kafka", str(config)])
        admin = self._admin_client()

        def listed() -> bool:
            try:
                if admin.list_topics(timeout=1.0).brokers:  # an unfenced broker answers with itself
                    self._admin = admin
                    return True
            except Exception:  # KafkaException: not listening yet
                pass
            return False

        return self._wait_until(listed, deadline)

    def _config(self, data: Path, controller_port: int) -> dict[str, str | int]:
        return {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": data,
            "auto.create.topics.enable": "false",  # tests name their topics: a typo fails instead of creating one
            # one node: every internal topic with one replica (and few partitions: they are created on demand)
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            # retention that tests can watch: 1 MiB segments (Kafka 4's minimum), checked every second,
            # deleted at once, from the start
            "log.segment.bytes": 1048576,
            "log.retention.check.interval.ms": 1000,
            "log.segment.delete.delay.ms": 0,
            "log.initial.task.delay.ms": 0,
            "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,  # 128 MiB of heap otherwise
            "num.network.threads": 2,
            "num.io.threads": 2,
        }

    def _end_process(self) -> None:
        self._admin = None
        super()._end_process()

    # --- facts ---

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _client_config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "broker.address.family": "v4",
            "reconnect.backoff.max.ms": 500,  # librdkafka waits up to 10 s between reconnects otherwise
            "logger": _LOG,
        }

    def _admin_client(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self._client_config())

    @property
    def admin(self) -> Any:
        """A confluent-kafka AdminClient connected to this broker."""
        if self._admin is None:
            raise KafkaError("the embedded Kafka broker is not started: use `with EmbeddedKafka() as kafka:`")
        return self._admin

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        """Creates a topic (one replica) and waits until every partition has a leader."""
        from confluent_kafka.admin import NewTopic

        topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        self.admin.create_topics([topic])[name].result(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = self.admin.list_topics(topic=name, timeout=5).topics.get(name)
            leaders = [p.leader for p in described.partitions.values()] if described and not described.error else []
            if len(leaders) == partitions and min(leaders) >= 0:
                return
            time.sleep(0.05)  # the poll's interval: leaders usually follow within milliseconds
        raise KafkaError(f"topic {name!r} has no leader for every partition 30 s after its creation")

    def produce(self, topic: str, records: Iterable[Record], partition: int | None = None) -> list[tuple[int, int]]:
        """Writes the records (values, or (key, value) pairs) and flushes; returns each one's (partition, offset)."""
        from confluent_kafka import Producer

        producer = Producer({**self._client_config(), "linger.ms": 5, "acks": "all"})
        delivered: list[tuple[int, int]] = []
        failures: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(str(err))
            else:
                delivered.append((msg.partition(), msg.offset()))

        for record in records:
            key, value = record if isinstance(record, tuple) else (None, record)
            if partition is None:
                producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
            else:
                producer.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
            producer.poll(0)  # serves delivery callbacks; keeps the local queue from filling up
        left = producer.flush(30)
        if failures or left:
            raise KafkaError(f"producing to {topic!r} failed: {failures[:3]}, {left} record(s) not delivered")
        return delivered

    def delete_records(self, topic: str, before: dict[int, int]) -> dict[int, int]:
        """Deletes each partition's records before the offset (Kafka's log start moves there, as retention
        moves it); returns the new earliest offset per partition."""
        from confluent_kafka import TopicPartition

        futures = self.admin.delete_records([TopicPartition(topic, p, offset) for p, offset in before.items()])
        return {tp.partition: future.result(timeout=30).low_watermark for tp, future in futures.items()}

    def earliest_offsets(self, topic: str) -> dict[int, int]:
        """The first offset still readable, per partition."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets(topic, OffsetSpec.earliest())

    def latest_offsets(self, topic: str) -> dict[int, int]:
        """The offset the next record will get, per partition."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets(topic, OffsetSpec.latest())

    def _list_offsets(self, topic: str, spec: Any) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        described = self.admin.list_topics(topic=topic, timeout=10).topics[topic]
        if described.error is not None:
            raise KafkaError(f"topic {topic!r}: {described.error}")
        futures = self.admin.list_offsets({TopicPartition(topic, p): spec for p in described.partitions})
        return {tp.partition: future.result(timeout=30).offset for tp, future in futures.items()}
