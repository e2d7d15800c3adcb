"""ACL authorization: the entries, an indexed immutable set of them, and the decision engine.

Kafka's semantics (docs/security.md, "Authorization (ACLs)"):

- an entry is (principal or ``*``, resource type, LITERAL or PREFIXED name, operation or ALL, ALLOW or DENY);
- a DENY that matches wins over every ALLOW; nothing matching is a refusal (default deny);
- an ALLOW of read, write, delete or alter also allows describe, alter_configs allows describe_configs
  (``model.IMPLIED``); a DENY is never widened that way;
- super users and cluster principals (``Principal.cluster``) pass every check;
- the anonymous principal matches no entry, not even ``*`` ("anyone authenticated"): with authorization
  on, an anonymous caller may do nothing.

A check is one dict lookup once made: :class:`AclAuthorizer` caches each decision per (principal name,
operation, resource), and the cache is thrown away with the set it was computed from (:meth:`replace`).
Computing a decision never scans every entry: :class:`AclSet` indexes entries by (resource type,
principal), literal names in a dict, prefixes in a dict probed once per distinct prefix length.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import AuthorizationError, InvalidArgument
from sluice.security.model import IMPLIED, Operation, Principal, Resource, ResourceType
from sluice.security.settings import SecuritySettings

__all__ = [
    "ALL",
    "AUTHORIZATION_MODES",
    "DEFAULT_CACHE_SIZE",
    "MAX_NAME",
    "WILDCARD",
    "AclAuthorizer",
    "AclEntry",
    "AclFilter",
    "AclOperation",
    "AclSet",
    "AnyOperation",
    "PatternType",
    "Permission",
    "parse_enum",
    "parse_operation",
]

log = logging.getLogger(__name__)

#: As a principal: anyone authenticated. As a LITERAL name: every resource of the type.
WILDCARD = "*"
#: ``--authorization``: ``none`` (everyone may do everything) or ``acl`` (default deny, ACLs allow).
AUTHORIZATION_MODES = ("none", "acl")
#: Decisions one authorizer caches at most; past that the oldest is dropped first.
DEFAULT_CACHE_SIZE = 100_000
#: Longest principal or resource name an entry may carry (names are 249 at most; principals may be DNs).
MAX_NAME = 1024


class PatternType(enum.Enum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Permission(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"


class AnyOperation(enum.Enum):
    """The operation of an entry that covers every operation (Kafka's ``All``)."""

    ALL = "all"


ALL = AnyOperation.ALL
AclOperation = Operation | AnyOperation


def parse_enum(kind: type[enum.Enum], value: object, what: str) -> Any:
    """``kind``'s member spelled ``value`` (case-insensitive); InvalidArgument naming ``what`` otherwise."""
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value).lower())
    except ValueError:
        known = ", ".join(str(m.value) for m in kind)
        raise InvalidArgument(f"unknown {what} {value!r}: expected one of {known}") from None


def parse_operation(value: object) -> AclOperation:
    """An entry's operation from its spelling (``read``, ..., ``all``); InvalidArgument otherwise."""
    if isinstance(value, Operation | AnyOperation):
        return value
    if str(value).lower() == ALL.value:
        return ALL
    result: Operation = parse_enum(Operation, value, "operation (or all)")
    return result


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"an ACL's {what} must not be empty")
    if len(value) > MAX_NAME or not value.isprintable():
        raise InvalidArgument(f"an ACL's {what} must be printable and at most {MAX_NAME} characters")
    return value


@dataclass(frozen=True, slots=True, order=True)
class AclEntry:
    """One rule. Built from user input through ``AclEntry.of`` (which validates every field)."""

    principal: str = field(compare=False)
    resource_type: ResourceType = field(compare=False)
    pattern: PatternType = field(compare=False)
    name: str = field(compare=False)
    operation: AclOperation = field(compare=False)
    permission: Permission = field(compare=False)
    #: The sort and equality key: every field's spelling (enums do not order).
    key: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_name(self.principal, "principal")
        _check_name(self.name, "resource name")
        for value, kind in (
            (self.resource_type, ResourceType),
            (self.pattern, PatternType),
            (self.permission, Permission),
        ):
            if not isinstance(value, kind):
                raise InvalidArgument(f"{value!r} is not a {kind.__name__}")
        if not isinstance(self.operation, Operation | AnyOperation):
            raise InvalidArgument(f"{self.operation!r} is not an operation")
        if self.resource_type is ResourceType.CLUSTER and (
            self.name != WILDCARD or self.pattern is not PatternType.LITERAL
        ):
            raise InvalidArgument("a cluster ACL names the cluster as the literal '*'")
        if self.pattern is PatternType.PREFIXED and self.name == WILDCARD:
            raise InvalidArgument("a prefixed ACL cannot be '*': use a literal '*' for every resource")
        key = (
            self.principal,
            self.resource_type.value,
            self.pattern.value,
            self.name,
            self.operation.value,
            self.permission.value,
        )
        object.__setattr__(self, "key", key)

    @classmethod
    def of(
        cls,
        principal: str,
        resource_type: ResourceType | str,
        name: str,
        operation: AclOperation | str,
        permission: Permission | str = Permission.ALLOW,
        pattern: PatternType | str = PatternType.LITERAL,
    ) -> AclEntry:
        """An entry from values or their spellings; raises InvalidArgument naming the bad field."""
        return cls(
            principal=principal,
            resource_type=parse_enum(ResourceType, resource_type, "resource type"),
            pattern=parse_enum(PatternType, pattern, "pattern type"),
            name=name,
            operation=parse_operation(operation),
            permission=parse_enum(Permission, permission, "permission"),
        )

    def to_dict(self) -> dict[str, str]:
        return dict(zip(_FIELDS, self.key, strict=True))

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AclEntry:
        missing = [f for f in _FIELDS if f not in doc]
        if missing:
            raise InvalidArgument(f"an ACL entry lacks {', '.join(missing)}")
        return cls.of(**{f: doc[f] for f in _FIELDS})

    def matches_name(self, name: str) -> bool:
        if self.pattern is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name in (WILDCARD, name)

    def grants(self, operation: Operation) -> bool:
        """Whether this entry (as an ALLOW) covers ``operation``, implied operations included."""
        op = self.operation
        return (
            op is ALL or op is operation or (isinstance(op, Operation) and operation in IMPLIED.get(op, ()))
        )

    def refuses(self, operation: Operation) -> bool:
        """Whether this entry (as a DENY) covers ``operation``: never widened by implication."""
        return self.operation is ALL or self.operation is operation


_FIELDS = ("principal", "resource_type", "pattern", "name", "operation", "permission")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Selects entries (describe, delete): every field left None matches anything."""

    principal: str | None = None
    resource_type: ResourceType | None = None
    pattern: PatternType | None = None
    name: str | None = None
    operation: AclOperation | None = None
    permission: Permission | None = None

    def matches(self, entry: AclEntry) -> bool:
        return all(
            want is None or want == have
            for want, have in (
                (self.principal, entry.principal),
                (self.resource_type, entry.resource_type),
                (self.pattern, entry.pattern),
                (self.name, entry.name),
                (self.operation, entry.operation),
                (self.permission, entry.permission),
            )
        )


class _Index:
    """The entries of one (resource type, principal): literal names in a dict, prefixes in a dict.

    A name's matching prefixes are found by probing ``name[:n]`` for each distinct prefix length ``n``
    (at most the 249 characters of a name, usually a handful): no scan over the entries, no scan over
    the prefixes. A trie would do the same in one walk of the name but costs a node per character.
    """

    __slots__ = ("literal", "prefix_lengths", "prefixed")

    def __init__(self) -> None:
        self.literal: dict[str, list[AclEntry]] = {}
        self.prefixed: dict[str, list[AclEntry]] = {}
        self.prefix_lengths: tuple[int, ...] = ()

    def add(self, entry: AclEntry) -> None:
        table = self.prefixed if entry.pattern is PatternType.PREFIXED else self.literal
        table.setdefault(entry.name, []).append(entry)

    def seal(self) -> None:
        self.prefix_lengths = tuple(sorted({len(p) for p in self.prefixed}))

    def matching(self, name: str) -> Iterator[AclEntry]:
        yield from self.literal.get(name, ())
        if name != WILDCARD:
            yield from self.literal.get(WILDCARD, ())
        for n in self.prefix_lengths:
            if n > len(name):
                break
            yield from self.prefixed.get(name[:n], ())


class AclSet:
    """An immutable, indexed set of entries at a security ``version`` (0: none yet)."""

    def __init__(self, entries: Iterable[AclEntry] = (), version: int = 0) -> None:
        self.version = version
        self.entries: tuple[AclEntry, ...] = tuple(sorted(set(entries)))
        self._index: dict[tuple[ResourceType, str], _Index] = {}
        for entry in self.entries:
            self._index.setdefault((entry.resource_type, entry.principal), _Index()).add(entry)
        for index in self._index.values():
            index.seal()

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[AclEntry]:
        return iter(self.entries)

    def __contains__(self, entry: object) -> bool:
        return entry in self.entries

    def __repr__(self) -> str:
        return f"AclSet(version={self.version}, entries={len(self.entries)})"

    def select(self, flt: AclFilter) -> list[AclEntry]:
        """The entries ``flt`` matches, sorted (describe and delete: a scan, never on a check's path)."""
        return [e for e in self.entries if flt.matches(e)]

    def matching(self, principal: Principal, resource: Resource) -> Iterator[AclEntry]:
        """The entries that apply to ``principal`` on ``resource`` (any operation, any permission)."""
        if principal.anonymous:
            return
        name = resource.name or WILDCARD  # the cluster resource has no name: its ACLs say '*'
        for who in (principal.name, WILDCARD):
            index = self._index.get((resource.type, who))
            if index is not None:
                yield from index.matching(name)

    def decide(self, principal: Principal, operation: Operation, resource: Resource) -> bool:
        """Deny wins, else any allow (with implied operations), else deny."""
        allowed = False
        for entry in self.matching(principal, resource):
            if entry.permission is Permission.DENY:
                if entry.refuses(operation):
                    return False
            elif not allowed:
                allowed = entry.grants(operation)
        return allowed


OnChange = Callable[[AclSet], None]


class AclAuthorizer:
    """Decides and caches: ``allowed`` is a dict lookup after the first check of the same question.

    One event loop uses it (the service's). ``replace`` swaps the set and drops every cached decision;
    then the ``on_change`` listeners run (the integrator re-checks open streams there).
    """

    def __init__(
        self,
        acls: AclSet | None = None,
        super_users: frozenset[str] = frozenset(),
        enabled: bool = True,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if cache_size < 1:
            raise ValueError("cache_size must be >= 1")
        self._acls = acls if acls is not None else AclSet()
        self.super_users = frozenset(super_users)
        self.enabled = enabled
        self._cache_size = cache_size
        self._cache: dict[tuple[str, Operation, Resource], bool] = {}
        self._listeners: list[OnChange] = []

    @classmethod
    def from_settings(cls, settings: SecuritySettings) -> AclAuthorizer:
        """The authorizer a service's ``--authorization`` and ``--super-users`` ask for (empty until its
        ``SecurityWatcher`` brings the first snapshot)."""
        mode = settings.authorization.strip().lower()
        if mode not in AUTHORIZATION_MODES:
            known = ", ".join(AUTHORIZATION_MODES)
            raise InvalidArgument(f"--authorization {settings.authorization!r}: expected one of {known}")
        users = frozenset(u.strip() for u in settings.super_users.split(",") if u.strip())
        return cls(super_users=users, enabled=mode == "acl")

    @property
    def acls(self) -> AclSet:
        return self._acls

    @property
    def version(self) -> int:
        return self._acls.version

    @property
    def cached(self) -> int:
        """Decisions held now (tests, metrics)."""
        return len(self._cache)

    def replace(self, acls: AclSet) -> None:
        """Use ``acls`` from now on (a new cache), then tell the listeners."""
        self._acls = acls
        self._cache = {}
        for listener in list(self._listeners):
            try:
                listener(acls)
            except Exception:  # one listener's bug must not stop the others or the watcher
                log.exception("an ACL change listener failed")

    def on_change(self, callback: OnChange) -> Callable[[], None]:
        """Call ``callback(new_set)`` after every ``replace``; returns a function that unsubscribes."""
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    def allowed(self, principal: Principal, operation: Operation, resource: Resource) -> bool:
        if not self.enabled or principal.cluster or principal.name in self.super_users:
            return True
        key = (principal.name, operation, resource)
        cache = self._cache
        decision = cache.get(key)
        if decision is None:
            decision = self._acls.decide(principal, operation, resource)
            if len(cache) >= self._cache_size:
                del cache[next(iter(cache))]  # the oldest: dicts keep insertion order
            cache[key] = decision
        return decision

    def allowed_on_some(
        self, principal: Principal, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Whether some ACL allows ``operation`` on some resource of ``resource_type`` (an idempotent
        producer's id needs write on any topic: Kafka's KIP-679). A scan, asked once per producer."""
        if not self.enabled or principal.cluster or principal.name in self.super_users:
            return True
        if principal.anonymous:
            return False
        return any(
            entry.resource_type is resource_type
            and entry.principal in (principal.name, WILDCARD)
            and entry.permission is Permission.ALLOW
            and entry.grants(operation)
            for entry in self._acls
        )

    def authorize(self, principal: Principal, operation: Operation, resource: Resource) -> None:
        """Raise AuthorizationError unless allowed. The message names what was asked, exactly as asked,
        and nothing about whether the resource exists (nothing here knows)."""
        if not self.allowed(principal, operation, resource):
            who = repr(principal.name) if principal.name else "an anonymous caller"
            raise AuthorizationError(f"{who} is not authorized to {operation.value} {resource}")
