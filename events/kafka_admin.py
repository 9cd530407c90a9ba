"""Creating the Kafka log's topic (``shoal kafka init``; the tests): the admin side of
``events.kafka``, which only checks, when it starts, that the topic is there."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from events.errors import LogError
from events.kafka_settings import KafkaSettings, guard_client_logs, redact


async def create_topic(
    settings: KafkaSettings, *, retention_ms: int | None = None, exist_ok: bool = True
) -> bool:
    """Create the topic with ``settings.partitions`` partitions; False if it existed."""
    options = settings.client_options()
    guard_client_logs(options.get("sasl_plain_password"))
    admin = AIOKafkaAdminClient(**options)
    try:
        await admin.start()
        existing = await admin.list_topics()
        if settings.topic in existing:
            if not exist_ok:
                raise LogError(f"topic {settings.topic!r} already exists")
            return False
        configs = {"retention.ms": str(retention_ms)} if retention_ms is not None else {}
        await admin.create_topics(
            [NewTopic(settings.topic, settings.partitions, 1, topic_configs=configs)]
        )
        await _until_served(admin, settings)
        return True
    except KafkaError as exc:
        secret = options.get("sasl_plain_password")
        raise LogError(redact(f"kafka {settings.bootstrap}: {exc}", secret)) from None
    finally:
        await admin.close()


async def _until_served(admin: AIOKafkaAdminClient, settings: KafkaSettings) -> None:
    """Wait until the broker's metadata has the new topic with a leader for every
    partition: a broker learns of a topic its controller created a moment later, and a
    client started before then would find no such topic."""
    deadline = asyncio.get_running_loop().time() + settings.request_timeout_ms / 1000
    while True:
        topics = await admin.describe_topics([settings.topic])
        parts = [p for t in topics if t["error_code"] == 0 for p in t["partitions"]]
        if len(parts) >= settings.partitions and all(p["leader"] >= 0 for p in parts):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise LogError(
                f"kafka {settings.bootstrap}: topic {settings.topic!r} created, "
                "but not served in time"
            )
        await asyncio.sleep(0.02)
