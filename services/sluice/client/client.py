"""The SDK façade: ``Client`` owns the channels and metadata, and makes the parts.

::

    from sluice import Client
    with Client("127.0.0.1:7600") as client:
        client.admin.create_topic("orders", partitions=4)
        with client.producer("orders", linger="10ms") as producer:
            meta = producer.send(b"v", key=b"k", tag="tagA").result()
        fetcher = client.fetcher({("orders", meta.partition): meta.offset})
        records = fetcher.fetch(timeout=1.0)

The client bootstraps from the coordinator alone (``bootstrap``, else the
``SLUICE_BOOTSTRAP`` environment variable, else ``127.0.0.1:7600``) and learns
every broker's address from the coordinator's Metadata.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from sluice.client.admin import Admin
from sluice.client.consumer import Consumer, ConsumerConfig, subscription_of
from sluice.client.consumer.fetch_driver import FetchDriver
from sluice.client.consumer.group_driver import GroupDriver
from sluice.client.fetch_validate import check_positions
from sluice.client.fetcher import AutoOffsetReset, Fetcher, TopicPartition
from sluice.client.links import BrokerLinks
from sluice.client.memory import ClientMemory
from sluice.client.metadata import ClusterMetadata, MetadataCache
from sluice.client.offsets import OffsetSpec, list_offsets
from sluice.client.producer import Producer, ProducerConfig
from sluice.client.push import PushConsumer, PushConsumerConfig
from sluice.client.push.admin import SubscriptionInfo, describe_subscription, list_subscriptions
from sluice.client.push.config import SUBSCRIPTION_TYPES
from sluice.client.retry_setup import make_parker, make_retrier, retry_subscription
from sluice.common.client_security import ClientSecurity, TLSConfig
from sluice.common.client_tls import tls_from_env
from sluice.common.names import validate_group, validate_topic
from sluice.common.peers import Peers
from sluice.errors import InvalidArgument, SluiceError
from sluice.security.credentials import token_source

__all__ = ["DEFAULT_BOOTSTRAP", "Client"]

DEFAULT_BOOTSTRAP = "127.0.0.1:7600"
BOOTSTRAP_ENV = "SLUICE_BOOTSTRAP"
_ids = itertools.count(1)


class Client:
    """Entry point of the SDK. Thread-safe; share one per process and ``close()`` it.

    Parameters:
        bootstrap: the coordinator's ``host:port``.
        client_id: a name for this client in broker logs and metrics
            (default ``sluice-python-<pid>-<n>``).
        request_timeout: seconds one admin, metadata or list-offsets RPC may take.
        tls: TLS towards the services (``TLSConfig(ca=..., cert=..., key=...)``; cert and key for
            mTLS). Default: from ``SLUICE_TLS_CA``/``_CERT``/``_KEY``/``_SERVER_NAME``, else plaintext.
        token: a bearer token, or a function returning a fresh one (asked at every call and every
            new connection).
        token_file: a file holding the token, read again when it changes (a projected Kubernetes
            ServiceAccount token).
        username, password: log in with SCRAM-SHA-256; the session token it returns is sent, renewed
            before it expires, and fetched again when a server refuses it.
            Precedence: ``token``/``token_file`` > ``username``/``password`` > ``SLUICE_TOKEN`` >
            ``SLUICE_TOKEN_FILE`` > ``SLUICE_USERNAME``/``SLUICE_PASSWORD`` > none. A token and a
            user name together are refused (InvalidArgument).
        memory_limit: bytes every consumer made here may hold prefetched, together (group
            consumers' prefetch buffers and push consumers' receive queues); when reached they
            stop fetching or granting permits until the application takes messages. 0: no
            limit beyond each consumer's own (docs/memory.md, "SDK").

    Every connection the client makes (gRPC channels, wire connections, the group and push
    consumers') uses ``tls`` and ``token``.
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        client_id: str | None = None,
        request_timeout: float = 30.0,
        *,
        tls: TLSConfig | None = None,
        token: str | Callable[[], str] | None = None,
        token_file: str | Path | None = None,
        username: str | None = None,
        password: str | None = None,
        memory_limit: int = 0,
    ) -> None:
        address = (bootstrap or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP).strip()
        if not _valid_address(address):
            raise InvalidArgument(f"bootstrap must be host:port, got {address!r}")
        if (
            isinstance(request_timeout, bool)
            or not isinstance(request_timeout, int | float)
            or request_timeout <= 0
        ):
            raise InvalidArgument(
                f"request_timeout must be a positive number of seconds, got {request_timeout!r}"
            )
        self.bootstrap = address
        self.client_id = client_id or f"sluice-python-{os.getpid()}-{next(_ids)}"
        self.request_timeout = float(request_timeout)
        tls = tls_from_env(tls)
        source = token_source(
            address, tls, token=token, token_file=token_file, username=username, password=password
        )
        self.security = ClientSecurity(tls=tls, token=source)
        #: A login made here is closed with the client; a token source passed in is the caller's.
        self._own_source = source if token is None else None
        self._channels = Peers(security=self.security)
        self._metadata = MetadataCache(self._channels, address, self.request_timeout)
        #: One wire connection per broker, shared by every producer, fetcher and consumer made here.
        self._links = BrokerLinks(self._channels, self._metadata, self.client_id)
        #: One event loop heartbeats every group consumer made here (started with the first).
        self._group_driver = GroupDriver(
            address, name=f"sluice-groups-{self.client_id}", security=self.security
        )
        #: One thread does the fetch work of every group consumer made here (docs/consumer.md).
        self._fetch_driver = FetchDriver(name=f"sluice-fetch-{self.client_id}")
        self.admin = Admin(self._metadata, self.request_timeout, self._channels)
        self._lock = threading.Lock()
        self._producers: set[Producer] = set()
        self._fetchers: weakref.WeakSet[Fetcher] = weakref.WeakSet()
        self._push_consumers: set[PushConsumer] = set()
        self._consumers: set[Consumer] = set()
        self._closed = False
        #: What every consumer made here may hold prefetched, together (docs/memory.md, "SDK").
        try:
            self.memory = ClientMemory(memory_limit)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    # ---- metadata and offsets ---------------------------------------------------------------

    def metadata(self, topics: Iterable[str] | None = None, refresh: bool = False) -> ClusterMetadata:
        """Brokers and topic placement, cached; ``refresh`` asks the coordinator again.

        Topics that do not exist are listed in ``unknown_topics`` (``md.topic(name)``
        raises UnknownTopicOrPartition for them).
        """
        self._check_open()
        names = (
            None
            if topics is None
            else [validate_topic(t) for t in ([topics] if isinstance(topics, str) else topics)]
        )
        return self._metadata.get(names, refresh=refresh)

    def list_offsets(
        self, topic: str, spec: OffsetSpec = "earliest", partitions: Iterable[int] | None = None
    ) -> dict[int, int]:
        """``{partition: offset}``: "earliest" (log start), "latest" (high watermark), or
        for a timestamp in ms the first offset whose record timestamp is >= it."""
        self._check_open()
        validate_topic(topic)
        return list_offsets(
            self._channels, self._metadata, topic, spec, partitions=partitions, timeout=self.request_timeout
        )

    # ---- parts --------------------------------------------------------------------------------

    def producer(self, topic: str, *, config: ProducerConfig | None = None, **overrides: Any) -> Producer:
        """A producer for ``topic``. ``overrides`` are ProducerConfig fields (``linger="10ms"``).

        Raises UnknownTopicOrPartition when the topic does not exist and InvalidArgument
        for unknown or bad settings.
        """
        self._check_open()
        validate_topic(topic)
        cfg = (config or ProducerConfig()).replace(**overrides) if overrides else (config or ProducerConfig())
        producer = Producer(
            topic,
            cfg,
            self._channels,
            self._metadata,
            on_close=self._forget_producer,
            links=self._links,
            client_id=self.client_id,
        )
        with self._lock:
            self._producers.add(producer)
        return producer

    def check_positions(
        self, positions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, int]:
        """KIP-320 for readers that keep their own positions (the Spark source): ``{tp: (offset, leader
        epoch of the records before it)}`` -> the offsets, lower only where the current leader's log was
        truncated below them (``fetch_validate.check_positions``)."""
        self._check_open()
        return check_positions(self._channels, self._metadata, positions, self.request_timeout)

    def fetcher(
        self,
        positions: Mapping[TopicPartition, int],
        filters: Mapping[str, str] | None = None,
        *,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 50 * 1024 * 1024,
        partition_max_bytes: int = 1024 * 1024,
        auto_offset_reset: AutoOffsetReset = "none",
        use_sessions: bool = True,
        check_crcs: bool = True,
    ) -> Fetcher:
        """A low-level fetcher reading ``positions`` ({(topic, partition): offset}).

        ``filters`` maps a topic to a tag expression (``"a || b"``; ``"*"`` for all).
        See :class:`~sluice.client.fetcher.Fetcher`.
        """
        self._check_open()
        fetcher = Fetcher(
            self._channels,
            self._metadata,
            positions,
            filters,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            partition_max_bytes=partition_max_bytes,
            auto_offset_reset=auto_offset_reset,
            client_id=self.client_id,
            request_timeout=self.request_timeout,
            use_sessions=use_sessions,
            check_crcs=check_crcs,
            links=self._links,
        )
        with self._lock:
            self._fetchers.add(fetcher)
        return fetcher

    def push_consumer(
        self,
        topic: str,
        subscription: str,
        type: str = "exclusive",
        *,
        config: PushConsumerConfig | None = None,
        **overrides: Any,
    ) -> PushConsumer:
        """A consumer of push subscription ``subscription`` on ``topic``.

        ``type``: exclusive, shared, failover or key_shared. ``overrides`` are
        PushConsumerConfig fields (``receiver_queue_size=0``, ``nack_delay="500ms"``).
        Returns once every dispatcher stream is subscribed; raises the dispatcher's typed
        error otherwise (ConsumerBusy, SubscriptionTypeMismatch, UnknownTopicOrPartition).
        See docs/push-consumer.md.
        """
        self._check_open()
        validate_topic(topic)
        validate_group(subscription, "subscription")
        if type not in SUBSCRIPTION_TYPES:
            raise InvalidArgument(
                f"unknown subscription type {type!r}: choose one of {', '.join(SUBSCRIPTION_TYPES)}"
            )
        cfg = (
            (config or PushConsumerConfig()).replace(**overrides)
            if overrides
            else (config or PushConsumerConfig())
        )
        pc = PushConsumer(
            topic,
            subscription,
            type,
            cfg,
            self._channels,
            self._metadata,
            self.client_id,
            self._forget_push,
            memory=self.memory,
        )
        with self._lock:
            self._push_consumers.add(pc)
        return pc

    def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionInfo]:
        """Push subscriptions loaded on the dispatchers (of ``topic``): type, consumers, backlog."""
        self._check_open()
        if topic is not None:
            validate_topic(topic)
        return list_subscriptions(self._channels, self._metadata, topic, self.request_timeout)

    def describe_subscription(self, topic: str, subscription: str) -> SubscriptionInfo:
        """One push subscription with its consumers' permits, unacked counts and blocked flags."""
        self._check_open()
        validate_topic(topic)
        return describe_subscription(
            self._channels, self._metadata, topic, subscription, self.request_timeout
        )

    def consumer(
        self,
        group: str,
        subscribe: Mapping[str, str] | Iterable[str] | str,
        *,
        config: ConsumerConfig | None = None,
        **overrides: Any,
    ) -> Consumer:
        """Join consumer group ``group``; see :class:`~sluice.client.consumer.Consumer`.

        ``subscribe`` maps topics to tag filters (``{"orders": "tagA || tagB"}``); a list of
        topics (or one topic) reads everything. ``overrides`` are ConsumerConfig fields
        (``auto_offset_reset="earliest"``, ``on_revoke=fn``). The join happens before this
        returns, so a refused subscription (InconsistentSubscription, an unknown topic or
        assignor) raises here. See docs/consumer.md.
        """
        self._check_open()
        validate_group(group)
        cfg = self.consumer_config(config, overrides)
        subscription = subscription_of(subscribe)
        if cfg.retry:  # docs/retry.md: the group's retry and DLQ topics, and the retry subscription
            subscription = retry_subscription(self, group, cfg, subscription)
        consumer = Consumer(
            self._channels,
            self._metadata,
            group,
            subscription,
            cfg,
            self.client_id,
            on_close=self._forget_consumer,
            links=self._links,
            group_driver=self._group_driver,
            fetch_driver=self._fetch_driver,
            memory=self.memory,
        )
        if cfg.retry:
            consumer._retry = make_retrier(self, group, cfg, cfg.request_timeout.total_seconds())
        if cfg.park_poison_keys:  # docs/poison-keys.md, "Pull consumers"
            consumer._park = make_parker(self, group, cfg, cfg.request_timeout.total_seconds())
        with self._lock:
            self._consumers.add(consumer)
        return consumer

    def consumer_config(self, config: ConsumerConfig | None, overrides: Mapping[str, Any]) -> ConsumerConfig:
        """The configuration ``consumer(config=config, **overrides)`` uses (sluice.aio builds the same)."""
        # Without a config of its own, the consumer's RPCs wait as long as the client's.
        base = config or ConsumerConfig(request_timeout=timedelta(seconds=self.request_timeout))
        return base.replace(**overrides) if overrides else base

    # ---- lifecycle ----------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Close every group consumer (committing and leaving its group), push consumer,
        producer (delivering buffered records, up to ``timeout`` each) and fetcher made by
        this client, then the channels. Idempotent."""
        with self._lock:
            if self._closed:
                return
            consumers = list(self._consumers)
        for c in consumers:
            c.close()
        with self._lock:
            self._closed = True
            producers = list(self._producers)
            fetchers = list(self._fetchers)
            push_consumers = list(self._push_consumers)
        for pc in push_consumers:
            pc.close()
        for p in producers:
            p.close(timeout)
        for f in fetchers:
            f.close()
        self._group_driver.close()
        self._fetch_driver.close()
        self._links.close()
        self._channels.close()
        close_source = getattr(self._own_source, "close", None)  # a login's own channel
        if callable(close_source):
            close_source()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client bootstrap={self.bootstrap!r} client_id={self.client_id!r}>"

    def _forget_producer(self, producer: Producer) -> None:
        with self._lock:
            self._producers.discard(producer)

    def _forget_consumer(self, consumer: Consumer) -> None:
        with self._lock:
            self._consumers.discard(consumer)

    def _forget_push(self, pc: PushConsumer) -> None:
        with self._lock:
            self._push_consumers.discard(pc)

    def _check_open(self) -> None:
        if self._closed:
            raise SluiceError("the client is closed")


def _valid_address(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
