"""Typed errors shared by the services and the SDK: one class per wire code.

The root class, the code -> class registry and the decoders live in ``sluice.error_base`` and are
re-exported here: import every error from this module.
"""

from __future__ import annotations

from sluice.error_base import SluiceError, error_for_code, error_from_proto, raise_for_proto, registry

# The one truncation of echoed inputs and of whole messages (issue 16), re-exported.
from sluice.error_text import ECHO_LIMIT, MAX_ERROR_MESSAGE_BYTES, bounded_message, echo
from sluice.errors_compression import UnsupportedCompression
from sluice.errors_messaging import (
    DelayBeyondRetention,
    DelayedDeliveryUnavailable,
    DelayLevelOutOfRange,
    DelayTooLong,
    NotADlqTopic,
    ParkStoreLoading,
    ReconsumeRefused,
    RecordNotOwned,
)
from sluice.errors_serde import DeserializationError, SerdeExtraMissing, SerializationError, UnknownSchema
from sluice.v1 import common_pb2

__all__ = [
    "ECHO_LIMIT",
    "MAX_ERROR_MESSAGE_BYTES",
    "DelayBeyondRetention",
    "DelayLevelOutOfRange",
    "DelayTooLong",
    "DelayedDeliveryUnavailable",
    "DeserializationError",
    "NotADlqTopic",
    "ParkStoreLoading",
    "ReconsumeRefused",
    "RecordNotOwned",
    "SerdeExtraMissing",
    "SerializationError",
    "SluiceError",
    "UnknownSchema",
    "UnsupportedCompression",
    "bounded_message",
    "echo",
    "error_for_code",
    "error_from_proto",
    "raise_for_proto",
    "registry",
]


# ---- Generic -----------------------------------------------------------------


class InvalidArgument(SluiceError, ValueError):
    code = common_pb2.INVALID_ARGUMENT
    grpc_status = "INVALID_ARGUMENT"


class InvalidRequest(SluiceError, ValueError):
    code = common_pb2.INVALID_REQUEST
    grpc_status = "INVALID_ARGUMENT"


class CredentialsError(SluiceError):
    """The root of refusals for the caller's credentials: catch it for both kinds below."""


class AuthenticationError(CredentialsError):
    """No credentials, or credentials the service does not accept (expired, wrong signature, unknown user,
    a wrong password). Retrying with the same credentials does not help."""

    code = common_pb2.UNAUTHENTICATED
    grpc_status = "UNAUTHENTICATED"


class CredentialsExpired(CredentialsError):
    """The credentials a stream or connection opened with expired (or its user's password changed):
    reconnect with fresh ones. The SDK does, asking its token source again."""

    code = common_pb2.CREDENTIALS_EXPIRED
    retriable = True
    grpc_status = "UNAUTHENTICATED"


#: The name the services use; the SDK's users see AuthenticationError.
Unauthenticated = AuthenticationError


class AuthorizationError(SluiceError, PermissionError):
    """Authenticated, but no ACL allows this operation on this resource (docs/security.md)."""

    code = common_pb2.PERMISSION_DENIED
    grpc_status = "PERMISSION_DENIED"


PermissionDenied = AuthorizationError


class RequestTimedOut(SluiceError, TimeoutError):
    code = common_pb2.REQUEST_TIMED_OUT
    retriable = True
    grpc_status = "DEADLINE_EXCEEDED"


class StorageError(SluiceError):
    code = common_pb2.STORAGE_ERROR
    retriable = True
    grpc_status = "UNAVAILABLE"


class StorageFull(SluiceError):
    """The log directory is below its minimum of free bytes (or a write met ENOSPC): writes are
    refused, reads go on, and writes resume by themselves once space returns (docs/storage.md,
    "Disk full"). Not a StorageError subclass: registered classes never derive from each other."""

    code = common_pb2.STORAGE_FULL
    retriable = True
    grpc_status = "RESOURCE_EXHAUSTED"


class CommitOutcomeUnknown(SluiceError):
    """A write reached Redis (or may have) but its answer was lost: it may or may not be stored. Never
    report it as stored; retry it (commits and cursor saves are idempotent)."""

    code = common_pb2.COMMIT_OUTCOME_UNKNOWN
    retriable = True
    grpc_status = "UNAVAILABLE"


# ---- Topics and the log -------------------------------------------------------


class UnknownTopicOrPartition(SluiceError, LookupError):
    code = common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    grpc_status = "NOT_FOUND"


class UnknownTopicId(SluiceError, LookupError):
    """A write names a topic incarnation that is gone: the topic was deleted (and perhaps re-created
    under the same name with a new ``topic_id``). Not retriable as is: the writer's position belongs to
    the old topic; it must re-read Metadata and start over on the new one."""

    code = common_pb2.UNKNOWN_TOPIC_ID
    grpc_status = "NOT_FOUND"


class InvalidTopic(SluiceError, ValueError):
    code = common_pb2.INVALID_TOPIC
    grpc_status = "INVALID_ARGUMENT"


class TopicAlreadyExists(SluiceError):
    code = common_pb2.TOPIC_ALREADY_EXISTS
    grpc_status = "ALREADY_EXISTS"


class InvalidPartitions(SluiceError, ValueError):
    code = common_pb2.INVALID_PARTITIONS
    grpc_status = "INVALID_ARGUMENT"


class OffsetOutOfRange(SluiceError):
    code = common_pb2.OFFSET_OUT_OF_RANGE
    grpc_status = "OUT_OF_RANGE"


class CorruptBatch(SluiceError, ValueError):
    code = common_pb2.CORRUPT_BATCH
    grpc_status = "INVALID_ARGUMENT"


class UnsupportedVersion(SluiceError, ValueError):
    """A batch in a format version the broker does not take (format 1: upgrade the client)."""

    code = common_pb2.UNSUPPORTED_VERSION
    grpc_status = "FAILED_PRECONDITION"


class BatchTooLarge(SluiceError, ValueError):
    code = common_pb2.BATCH_TOO_LARGE
    grpc_status = "INVALID_ARGUMENT"


class NotLeader(SluiceError):
    """The partition is not (or not yet) hosted by this broker: refresh metadata."""

    code = common_pb2.NOT_LEADER
    retriable = True
    grpc_status = "UNAVAILABLE"


class InvalidFilter(SluiceError, ValueError):
    code = common_pb2.INVALID_FILTER
    grpc_status = "INVALID_ARGUMENT"


class FetchSessionNotFound(SluiceError):
    code = common_pb2.FETCH_SESSION_NOT_FOUND
    retriable = True
    grpc_status = "FAILED_PRECONDITION"


class InvalidFetchSessionEpoch(SluiceError):
    code = common_pb2.INVALID_FETCH_SESSION_EPOCH
    retriable = True
    grpc_status = "FAILED_PRECONDITION"


# ---- Cluster -------------------------------------------------------------------


class NotCoordinator(SluiceError):
    """This coordinator replica is not the leader; the message names the leader."""

    code = common_pb2.NOT_COORDINATOR
    retriable = True
    grpc_status = "UNAVAILABLE"


class BrokerNotAvailable(SluiceError):
    code = common_pb2.BROKER_NOT_AVAILABLE
    retriable = True
    grpc_status = "UNAVAILABLE"


class BrokerUpdateFailed(SluiceError):
    """The coordinator recorded a topic change but a broker did not apply it (the message says which
    and why). Retrying the same request completes it once the broker can (docs/coordinator.md)."""

    code = common_pb2.BROKER_UPDATE_FAILED
    retriable = True
    grpc_status = "UNAVAILABLE"


# ---- Consumer groups --------------------------------------------------------------


class UnknownGroup(SluiceError, LookupError):
    code = common_pb2.UNKNOWN_GROUP
    grpc_status = "NOT_FOUND"


class UnknownMember(SluiceError):
    code = common_pb2.UNKNOWN_MEMBER
    grpc_status = "NOT_FOUND"


class InconsistentSubscription(SluiceError):
    code = common_pb2.INCONSISTENT_SUBSCRIPTION
    grpc_status = "FAILED_PRECONDITION"


class StaleMemberEpoch(SluiceError):
    code = common_pb2.STALE_MEMBER_EPOCH
    grpc_status = "FAILED_PRECONDITION"


class FencedMemberEpoch(SluiceError):
    code = common_pb2.FENCED_MEMBER_EPOCH
    grpc_status = "FAILED_PRECONDITION"


class NotOwner(SluiceError):
    code = common_pb2.NOT_OWNER
    grpc_status = "FAILED_PRECONDITION"


class UnknownAssignor(SluiceError, ValueError):
    code = common_pb2.UNKNOWN_ASSIGNOR
    grpc_status = "INVALID_ARGUMENT"


class GroupNotEmpty(SluiceError):
    code = common_pb2.GROUP_NOT_EMPTY
    grpc_status = "FAILED_PRECONDITION"


# ---- Push subscriptions -----------------------------------------------------------


class ConsumerBusy(SluiceError):
    code = common_pb2.CONSUMER_BUSY
    grpc_status = "FAILED_PRECONDITION"


class InvalidPermits(SluiceError, ValueError):
    code = common_pb2.INVALID_PERMITS
    grpc_status = "INVALID_ARGUMENT"


class SubscriptionTypeMismatch(SluiceError):
    code = common_pb2.SUBSCRIPTION_TYPE_MISMATCH
    grpc_status = "FAILED_PRECONDITION"


class UnknownMessageId(SluiceError):
    code = common_pb2.UNKNOWN_MESSAGE_ID
    grpc_status = "INVALID_ARGUMENT"


class ProtocolViolation(SluiceError):
    code = common_pb2.PROTOCOL_VIOLATION
    grpc_status = "FAILED_PRECONDITION"


class NotDispatcher(SluiceError):
    code = common_pb2.NOT_DISPATCHER
    retriable = True
    grpc_status = "UNAVAILABLE"


class UnknownSubscription(SluiceError, LookupError):
    """No durable subscription of that name on the topic (never created, or deleted), and no
    consumer holds a non-durable one."""

    code = common_pb2.UNKNOWN_SUBSCRIPTION
    grpc_status = "NOT_FOUND"


class SubscriptionInUse(SluiceError):
    """An admin change (delete, reset, skip) of a subscription with connected consumers, without force."""

    code = common_pb2.SUBSCRIPTION_IN_USE
    grpc_status = "FAILED_PRECONDITION"


# ---- Idempotent producers ---------------------------------------------------------


class OutOfOrderSequence(SluiceError):
    """A batch's first sequence is not the one after the producer's last batch on the partition."""

    code = common_pb2.OUT_OF_ORDER_SEQUENCE
    grpc_status = "FAILED_PRECONDITION"


class InvalidProducerEpoch(SluiceError):
    """The producer was fenced: a newer epoch of the same producer id has written to the partition."""

    code = common_pb2.INVALID_PRODUCER_EPOCH
    grpc_status = "FAILED_PRECONDITION"


class UnknownProducerId(SluiceError):
    """The broker no longer remembers the producer (its state expired or was evicted)."""

    code = common_pb2.UNKNOWN_PRODUCER_ID
    grpc_status = "FAILED_PRECONDITION"


# ---- Replication -------------------------------------------------------------------


class NotEnoughReplicas(SluiceError):
    """Fewer replicas than required hold the write; it may not survive a failover. Retry."""

    code = common_pb2.NOT_ENOUGH_REPLICAS
    retriable = True
    grpc_status = "UNAVAILABLE"


# ---- Limits ------------------------------------------------------------------------------


class Throttled(SluiceError):
    """A rate limit refused the request; the message names the limit and the wait before a retry."""

    code = common_pb2.THROTTLED
    retriable = True
    grpc_status = "RESOURCE_EXHAUSTED"


# ---- Replication (the controller side, docs/replication.md) ----------------------


class InvalidReplicationFactor(SluiceError, ValueError):
    """A topic asks for more replicas than there are live brokers (or fewer than one). Sluice never
    places a topic under-replicated: start more brokers, or ask for fewer replicas."""

    code = common_pb2.INVALID_REPLICATION_FACTOR
    grpc_status = "INVALID_ARGUMENT"


class StaleControllerEpoch(SluiceError):
    """A partition update from a controller epoch older than one the broker has already seen: a deposed
    coordinator, or state restored from a Redis that rolled back. The broker refuses it."""

    code = common_pb2.STALE_CONTROLLER_EPOCH
    grpc_status = "FAILED_PRECONDITION"


class FencedLeaderEpoch(SluiceError):
    """The request names a leader epoch older than the partition's current one here: the sender (a
    follower, a consumer or a deposed leader) missed a leader change. Refresh metadata and retry."""

    code = common_pb2.FENCED_LEADER_EPOCH
    retriable = True
    grpc_status = "FAILED_PRECONDITION"


class UnknownLeaderEpoch(SluiceError):
    """The request names a leader epoch newer than this broker knows: the controller's news has not
    reached it yet. Retry after a short wait."""

    code = common_pb2.UNKNOWN_LEADER_EPOCH
    retriable = True
    grpc_status = "UNAVAILABLE"


class OffsetNotAvailable(SluiceError):
    """Right after a leader election: the offset is above the new leader's high watermark (the old
    leader had committed further), or its HW is still below the start of its epoch. Retry after a short
    wait: the HW catches up once the followers fetch from the new leader."""

    code = common_pb2.OFFSET_NOT_AVAILABLE
    retriable = True
    grpc_status = "UNAVAILABLE"


class StalePartitionEpoch(SluiceError):
    """An in-sync set change proposed against an older partition epoch than the controller's: the
    partition changed since. The leader proposes again from the newer state."""

    code = common_pb2.STALE_PARTITION_EPOCH
    retriable = True
    grpc_status = "FAILED_PRECONDITION"


class IneligibleReplica(SluiceError):
    """An in-sync set change adds a broker in a controlled shutdown (KIP-841): it is about to stop, and
    back in the ISR it would hold up acks=all writes. The leader proposes again from the pushed state."""

    code = common_pb2.INELIGIBLE_REPLICA
    retriable = True


class ReassignmentInProgress(SluiceError):
    """A reassignment names a partition whose previous reassignment has not completed yet."""

    code = common_pb2.REASSIGNMENT_IN_PROGRESS
    grpc_status = "FAILED_PRECONDITION"


# ---- Limits (docs/limits.md, "Cardinality and rate of change") ------------------


class LimitExceeded(SluiceError):
    """A configured cardinality limit would be exceeded (topics, partitions, groups, members, subscriptions,
    consumers per subscription, headers, filter length or depth). The message names the limit, its value
    and what was asked. ``limit`` and ``value`` are in ``fields`` for callers that branch on them."""

    code = common_pb2.LIMIT_EXCEEDED
    grpc_status = "RESOURCE_EXHAUSTED"


class ThrottlingQuotaExceeded(SluiceError):
    """The principal's creation/deletion rate (partition mutations per second, KIP-599) is used up: retry
    after ``throttle_ms`` (in ``fields`` on the server, and in the message)."""

    code = common_pb2.THROTTLING_QUOTA_EXCEEDED
    retriable = True
    grpc_status = "RESOURCE_EXHAUSTED"
