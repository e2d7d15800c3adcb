"""Push consumption (Pulsar-style subscriptions): ``client.push_consumer(...)``.

Parts, each its own module: ``config`` (PushConsumerConfig), ``message`` (Message),
``flow`` (the permit counters, pure), ``outbound`` (coalesced commands of one
stream), ``stream`` (one Consume stream per dispatcher, reconnecting), ``nacks``
(client-side nack backoff) and ``consumer`` (the PushConsumer façade); the reconnect
backoff is the peer layer's (``sluice.common.backoff``). See docs/push-consumer.md.
"""

from sluice.client.push.config import KeySharedPolicy, PushConsumerConfig, dlq_topic
from sluice.client.push.consumer import PushConsumer, PushConsumerStats
from sluice.client.push.message import Message, MessageId
from sluice.retry.levels import redrive_topic

__all__ = [
    "KeySharedPolicy",
    "Message",
    "MessageId",
    "PushConsumer",
    "PushConsumerConfig",
    "PushConsumerStats",
    "dlq_topic",
    "redrive_topic",
]
