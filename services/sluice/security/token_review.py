"""The optional Kubernetes TokenReview check (``--jwt-token-review``).

A JWKS check proves a ServiceAccount token was signed by the API server and has not expired. It cannot
see that the pod the token was bound to has been deleted (or its ServiceAccount): the token stays
cryptographically valid until its ``exp``, an hour or more. The API server knows, and answers a
TokenReview with ``authenticated: false`` for such a token. So, with this option, a token that passed
the JWKS check is also reviewed (in a thread: the Kubernetes client is blocking), and the answer is
trusted for ``--jwt-token-review-interval`` at most (the verifier's token cache holds it).

Fails closed: a review that cannot be made (API server unreachable, RBAC missing) refuses the token.
Sluice's ServiceAccount needs ``create`` on ``tokenreviews.authentication.k8s.io`` (the built-in
``system:auth-delegator`` ClusterRole).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from sluice.errors import AuthenticationError, InvalidArgument

__all__ = ["REQUEST_TIMEOUT", "TokenReviewApi", "TokenReviewer", "build_review", "decide"]

#: Seconds (connect, read) one TokenReview call may take before the token is refused.
REQUEST_TIMEOUT = (3.0, 5.0)


class TokenReviewApi(Protocol):
    """The one ``kubernetes.client.AuthenticationV1Api`` method used."""

    def create_token_review(self, body: Any, *, _request_timeout: Any = None) -> Any: ...


def build_review(token: str, audiences: Sequence[str]) -> Any:
    """The TokenReview to create: the token, and the audiences Sluice accepts (the API server then
    also checks the token was issued for one of them)."""
    from kubernetes import client

    return client.V1TokenReview(
        api_version="authentication.k8s.io/v1",
        kind="TokenReview",
        spec=client.V1TokenReviewSpec(token=token, audiences=list(audiences) or None),
    )


def decide(status: Any, *, subject: str, audiences: Sequence[str]) -> None:
    """Accept (return) or refuse (AuthenticationError) from a TokenReview's ``status``.

    Accepted only when the API server authenticated the token, as the same user the JWT names
    (``sub``), and, when audiences were asked for, for one of them.
    """
    if status is None or getattr(status, "authenticated", None) is not True:
        error = str(getattr(status, "error", None) or "not authenticated")[:200]
        raise AuthenticationError(f"JWT refused by the Kubernetes TokenReview: {error}")
    username = getattr(getattr(status, "user", None), "username", None)
    if username != subject:
        raise AuthenticationError(
            "JWT refused by the Kubernetes TokenReview: it names another user than the token's sub"
        )
    granted = getattr(status, "audiences", None) or []
    if audiences and not set(granted) & set(audiences):
        raise AuthenticationError("JWT refused by the Kubernetes TokenReview: not issued for this audience")


class TokenReviewer:
    """Reviews tokens with the API server; concurrent reviews of one token share one call."""

    def __init__(self, api: TokenReviewApi, audiences: Sequence[str]) -> None:
        self._api = api
        self._audiences = tuple(audiences)
        self._inflight: dict[str, asyncio.Future[Any]] = {}
        self.calls = 0

    @classmethod
    def in_cluster(cls, audiences: Sequence[str]) -> TokenReviewer:
        """A reviewer talking to the API server of the pod this process runs in."""
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException as exc:
            raise InvalidArgument(f"jwt_token_review: needs to run in a Kubernetes pod ({exc})") from exc
        return cls(client.AuthenticationV1Api(), audiences)

    async def review(self, token: str, subject: str) -> None:
        """Return when the API server vouches for ``token`` as ``subject``; else AuthenticationError."""
        pending = self._inflight.get(token)
        if pending is None or pending.get_loop() is not asyncio.get_running_loop():
            pending = asyncio.ensure_future(asyncio.to_thread(self._call, token))
            self._inflight[token] = pending
            pending.add_done_callback(lambda _: self._inflight.pop(token, None))
        status = await asyncio.shield(pending)
        decide(status, subject=subject, audiences=self._audiences)

    def _call(self, token: str) -> Any:
        self.calls += 1
        try:
            response = self._api.create_token_review(
                build_review(token, self._audiences), _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:  # the client raises ApiException, urllib3's and socket errors alike
            # Fail closed, and say why without the response body (it may echo the request).
            reason = getattr(exc, "reason", None) or type(exc).__name__
            raise AuthenticationError(f"JWT refused: the Kubernetes TokenReview failed ({reason})") from None
        return getattr(response, "status", None)
