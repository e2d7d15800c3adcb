"""mTLS (``--tls-client-auth require`` on every service) and the SDK end to end over TLS.

- a client whose certificate comes from another CA, or that has none, is refused on gRPC and on the
  wire with a typed error; one with a certificate from the cluster's CA works;
- produce, fetch, a group consumer and a push consumer work through the SDK over TLS with a client
  certificate and a token, on the wire protocol and with ``SLUICE_CLIENT_TRANSPORT=grpc``; the services
  call each other with their own certificates meanwhile (the dispatcher reads the broker, the broker
  and offset store call the coordinator).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from sluice import Client, TLSConfig
from sluice.client.wire import connect, hello_bytes
from sluice.common.client_security import ClientSecurity
from sluice.common.wire import PROTOCOL_VERSION
from sluice.errors import AuthenticationError, SluiceError
from sluice.security import certs
from tests.integration.push.helpers import drain
from tests.integration.security.conftest import TLSCluster, run_tls_cluster

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster() -> Iterator[TLSCluster]:
    with run_tls_cluster("require") as c:
        yield c


def _foreign(cluster: TLSCluster) -> TLSConfig:
    """The cluster's CA to verify the services, and a client certificate another CA issued."""
    other = certs.write_ca(cluster.pki / "other-ca", "Someone else's CA")
    issued = certs.issue(other, cluster.pki / "other-ca", "mallory", client=True)
    return TLSConfig(ca=cluster.ca.cert_path, cert=issued.cert_path, key=issued.key_path)


@pytest.mark.parametrize("which", ["foreign", "none"])
def test_a_client_certificate_from_another_ca_or_none_is_refused(cluster: TLSCluster, which: str) -> None:
    tls = _foreign(cluster) if which == "foreign" else cluster.tls(client_cert=False)
    with Client(cluster.bootstrap, request_timeout=2, tls=tls) as client, pytest.raises(SluiceError):
        client.metadata(refresh=True)
    hello = hello_bytes(PROTOCOL_VERSION, "mallory", ClientSecurity(tls))
    for sp in (cluster.broker, cluster.dispatcher):
        with pytest.raises(AuthenticationError):
            connect(cluster.wire(sp), hello, f"{sp.service} wire", 5, tls).close()
    # The right CA's certificate still works everywhere.
    with cluster.client() as client:
        assert client.metadata(refresh=True).brokers
        hello = hello_bytes(PROTOCOL_VERSION, "alice", client.security)
        for sp in (cluster.broker, cluster.dispatcher):
            connect(cluster.wire(sp), hello, f"{sp.service} wire", 5, client.security.tls).close()


@pytest.mark.parametrize("transport", ["wire", "grpc"])
def test_produce_fetch_group_and_push_over_tls(
    cluster: TLSCluster, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if transport == "grpc":
        monkeypatch.setenv("SLUICE_CLIENT_TRANSPORT", "grpc")
    tokens: list[str] = []

    def token() -> str:
        tokens.append("t")
        return f"token-{len(tokens)}"

    topic = f"tls-{transport}-{uuid.uuid4().hex[:6]}"
    with cluster.client(token=token) as client:
        client.admin.create_topic(topic, partitions=2)
        with client.producer(topic, partitioner="round_robin", linger="1ms") as producer:
            futures = [producer.send(str(i).encode()) for i in range(20)]
            producer.flush()
            assert all(f.result(10).offset >= 0 for f in futures)
        fetched = client.fetcher({(topic, 0): 0, (topic, 1): 0}).fetch(timeout=10)
        assert len(fetched) >= 1

        consumer = client.consumer(
            f"g-{topic}", [topic], auto_offset_reset="earliest", session_timeout="5s", fetch_max_wait="100ms"
        )
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 20:
            assert time.monotonic() < deadline, f"the group consumer got {len(got)} of 20"
            got += [r.value for r in consumer.poll(0.2)]
        assert sorted(int(v) for v in got) == list(range(20))
        consumer.close()

        pc = client.push_consumer(topic, f"s-{topic}", "shared", initial_position="earliest")
        try:
            pushed = drain(pc, 20, timeout=30)
        finally:
            pc.close()
        assert sorted(int(m.value) for m in pushed) == list(range(20))
    assert tokens  # the token source was asked (per call and per connection)
