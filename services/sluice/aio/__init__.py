"""The asyncio SDK: ``from sluice.aio import Client``.

The parts (Producer, Consumer, PushConsumer, Fetcher, Admin) wrap the thread-based SDK's own, so options,
configuration classes and typed errors (``sluice.errors``) are the same; see docs/asyncio.md.
"""

from sluice.aio.admin import Admin
from sluice.aio.client import Client
from sluice.aio.consumer import Consumer
from sluice.aio.fetcher import Fetcher
from sluice.aio.producer import Producer
from sluice.aio.push import PushConsumer
from sluice.client.consumer import ConsumerConfig
from sluice.client.producer import ProducerConfig, RecordMetadata
from sluice.client.push import Message, PushConsumerConfig

__all__ = [
    "Admin",
    "Client",
    "Consumer",
    "ConsumerConfig",
    "Fetcher",
    "Message",
    "Producer",
    "ProducerConfig",
    "PushConsumer",
    "PushConsumerConfig",
    "RecordMetadata",
]
