"""The Kubernetes TokenReview option, without a cluster: the request it builds, the decision it takes
from a response, and how the verifier uses it (a fake AuthenticationV1Api answering as the API server
would, e.g. ``authenticated: false`` for a deleted pod's token)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sluice.errors import AuthenticationError, InvalidArgument
from sluice.security.jwt_auth import JwtVerifier
from sluice.security.jwt_keys import parse_algorithms
from sluice.security.token_review import REQUEST_TIMEOUT, TokenReviewer, build_review, decide
from tests.jwt_tokens import AUDIENCE, ISSUER, claims, rsa_key, sign

SA = "system:serviceaccount:spark:executor"


def _status(
    authenticated: bool, username: str = SA, audiences: list[str] | None = None, error: str = ""
) -> Any:
    return client.V1TokenReviewStatus(
        authenticated=authenticated,
        user=client.V1UserInfo(username=username),
        audiences=[AUDIENCE] if audiences is None else audiences,
        error=error or None,
    )


class _Api:
    """Answers create_token_review as the API server would, for the tokens it knows."""

    def __init__(self) -> None:
        self.deleted: set[str] = set()
        self.bodies: list[Any] = []
        self.timeouts: list[Any] = []
        self.fail: Exception | None = None
        self.gate = threading.Event()
        self.gate.set()

    def create_token_review(self, body: Any, *, _request_timeout: Any = None) -> Any:
        assert self.gate.wait(5)
        self.bodies.append(body)
        self.timeouts.append(_request_timeout)
        if self.fail is not None:
            raise self.fail
        if body.spec.token in self.deleted:
            return client.V1TokenReview(
                spec=body.spec, status=_status(False, error='pod "job-exec-1" not found')
            )
        return client.V1TokenReview(spec=body.spec, status=_status(True))


def test_the_request_carries_the_token_and_the_audiences() -> None:
    review = build_review("tok", ["sluice"])
    assert (review.api_version, review.kind) == ("authentication.k8s.io/v1", "TokenReview")
    assert review.spec.token == "tok"
    assert review.spec.audiences == ["sluice"]
    serialized = client.ApiClient().sanitize_for_serialization(review)
    assert serialized["spec"] == {"token": "tok", "audiences": ["sluice"]}
    assert build_review("tok", []).spec.audiences is None


def test_decide_accepts_only_an_authenticated_matching_user_and_audience() -> None:
    decide(_status(True), subject=SA, audiences=[AUDIENCE])
    decide(_status(True, audiences=[]), subject=SA, audiences=[])
    with pytest.raises(AuthenticationError, match="not found"):
        decide(_status(False, error='pod "x" not found'), subject=SA, audiences=[AUDIENCE])
    with pytest.raises(AuthenticationError, match="not authenticated"):
        decide(None, subject=SA, audiences=[AUDIENCE])
    with pytest.raises(AuthenticationError, match="another user"):
        decide(_status(True, username="system:serviceaccount:x:y"), subject=SA, audiences=[AUDIENCE])
    with pytest.raises(AuthenticationError, match="audience"):
        decide(_status(True, audiences=["vault"]), subject=SA, audiences=[AUDIENCE])


def test_concurrent_reviews_of_one_token_share_one_call_and_failures_refuse() -> None:
    api = _Api()
    api.gate.clear()
    reviewer = TokenReviewer(api, [AUDIENCE])

    async def scenario() -> None:
        waiting = [asyncio.ensure_future(reviewer.review("tok", SA)) for _ in range(20)]
        await asyncio.sleep(0.05)
        api.gate.set()
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert len(api.bodies) == 1
        assert api.timeouts == [REQUEST_TIMEOUT]
        api.fail = ConnectionRefusedError("api server down")
        with pytest.raises(AuthenticationError, match="TokenReview failed") as info:
            await reviewer.review("tok2", SA)
        assert "tok2" not in str(info.value)

    asyncio.run(scenario())


def test_in_cluster_outside_a_cluster_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(InvalidArgument, match="needs to run in a Kubernetes pod"):
        TokenReviewer.in_cluster([AUDIENCE])


def _verifier(tmp_path: Path, api: _Api, now: list[float]) -> JwtVerifier:
    from tests.jwt_tokens import public_pem

    key_file = tmp_path / "key.pem"
    key_file.write_bytes(public_pem(rsa_key()))
    from sluice.security.jwt_keys import load_key_file

    algorithms = parse_algorithms("RS256")
    return JwtVerifier(
        algorithms=algorithms,
        issuer=ISSUER,
        audience=AUDIENCE,
        static_key=load_key_file(key_file, algorithms),
        reviewer=TokenReviewer(api, [AUDIENCE]),
        review_interval=60.0,
        clock=lambda: now[0],
    )


def test_a_deleted_pods_token_is_refused_once_its_review_is_due(tmp_path: Path) -> None:
    api = _Api()
    now = [time.time()]
    verifier = _verifier(tmp_path, api, now)
    token = sign(claims(), rsa_key())

    async def scenario() -> None:
        assert (await verifier.verify(token)).principal == SA
        await verifier.verify(token)
        assert len(api.bodies) == 1  # the review is cached with the token
        api.deleted.add(token)  # the pod is deleted; its token's signature and exp are still good
        now[0] += 30
        await verifier.verify(token)  # within the review interval: still the cached answer
        now[0] += 31
        with pytest.raises(AuthenticationError, match="not found"):
            await verifier.verify(token)
        assert len(api.bodies) == 2

    asyncio.run(scenario())


def test_a_review_is_asked_for_only_after_the_signature_checks(tmp_path: Path) -> None:
    api = _Api()
    verifier = _verifier(tmp_path, api, [time.time()])
    with pytest.raises(AuthenticationError, match="signature"):
        asyncio.run(verifier.verify(sign(claims(), rsa_key("other"))))
    assert api.bodies == []  # a forged token never reaches the API server
