"""User administration behind ``client.admin`` (``upsert_user``, ``delete_user``, ``list_users``).

The SCRAM credential is computed here from the password (``security/scram.py``): the coordinator receives
the salt, iteration count and the two derived keys, never the password (docs/security.md, "Passwords
(SCRAM) and session tokens").

Caller: :class:`sluice.client.admin.Admin` (and through it the CLI's ``sluice user``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.client.metadata import call_with_retry
from sluice.client.rpc import call
from sluice.common.peers import Peers
from sluice.security.scram import make_credential, validate_user_name
from sluice.v1 import auth_pb2, auth_pb2_grpc

__all__ = ["UserChange", "UserInfo", "delete_user", "list_users", "upsert_user"]


@dataclass(frozen=True, slots=True)
class UserInfo:
    name: str
    mechanism: str
    iterations: int
    #: Bumped by every password change (and kept across a delete): sessions of an older one are refused.
    generation: int


@dataclass(frozen=True, slots=True)
class UserChange:
    name: str
    generation: int
    #: upsert: whether the user is new. delete: whether there was such a user.
    changed: bool


def _stub(channels: Peers, bootstrap: str) -> auth_pb2_grpc.AuthStub:
    return channels.stub(bootstrap, auth_pb2_grpc.AuthStub)


def upsert_user(
    channels: Peers, bootstrap: str, name: str, password: str, iterations: int, timeout: float
) -> UserChange:
    validate_user_name(name)
    c = make_credential(password, iterations)
    request = auth_pb2.UpsertUserRequest(
        name=name,
        credential=auth_pb2.ScramCredential(
            mechanism=c.mechanism,
            salt=c.salt,
            iterations=c.iterations,
            stored_key=c.stored_key,
            server_key=c.server_key,
        ),
    )
    resp = call_with_retry(lambda: call(_stub(channels, bootstrap).UpsertUser, request, timeout), timeout)
    return UserChange(name, resp.generation, resp.created)


def delete_user(channels: Peers, bootstrap: str, name: str, timeout: float) -> UserChange:
    request = auth_pb2.DeleteUserRequest(name=validate_user_name(name))
    resp = call_with_retry(lambda: call(_stub(channels, bootstrap).DeleteUser, request, timeout), timeout)
    return UserChange(name, resp.generation, resp.deleted)


def list_users(channels: Peers, bootstrap: str, timeout: float) -> list[UserInfo]:
    request = auth_pb2.ListUsersRequest()
    resp = call_with_retry(lambda: call(_stub(channels, bootstrap).ListUsers, request, timeout), timeout)
    return [UserInfo(u.name, u.mechanism, u.iterations, u.generation) for u in resp.users]
