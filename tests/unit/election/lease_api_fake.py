"""An in-memory stand-in for the three ``CoordinationV1Api`` calls the Lease elector makes.

No Kubernetes API server can run here, so this fakes *Kubernetes'* API (not a Sluice component), with
the semantics the elector relies on: every write bumps ``metadata.resourceVersion``; ``replace`` with a
stale resourceVersion is a 409 Conflict; ``create`` of an existing Lease is a 409; a missing Lease is a
404. Bodies go through the real client's serializer and the API server's MicroTime rule, so a time
the real server would reject (not exactly six fractional digits) fails here too.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")


class FakeLeaseApi:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[tuple[str, str], Any] = {}
        self._rv = 100
        self.calls: list[str] = []
        #: Make the next N calls fail with this HTTP status (e.g. 500, as an unreachable API would).
        self.fail_next = 0
        self.fail_status = 500

    # ---- the three API methods -------------------------------------------------------------------

    def read_namespaced_lease(self, name: str, namespace: str, *, _request_timeout: Any = None) -> Any:
        with self._lock:
            self._enter("read")
            lease = self._leases.get((namespace, name))
            if lease is None:
                raise ApiException(status=404, reason="Not Found")
            return lease.model_copy(deep=True)

    def create_namespaced_lease(self, namespace: str, body: Any, *, _request_timeout: Any = None) -> Any:
        with self._lock:
            self._enter("create")
            self._check_wire_format(body)
            key = (namespace, body.metadata.name)
            if key in self._leases:
                raise ApiException(status=409, reason="AlreadyExists")
            return self._store(key, body)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: Any, *, _request_timeout: Any = None
    ) -> Any:
        with self._lock:
            self._enter("replace")
            self._check_wire_format(body)
            current = self._leases.get((namespace, name))
            if current is None:
                raise ApiException(status=404, reason="Not Found")
            if body.metadata.resource_version != current.metadata.resource_version:
                raise ApiException(status=409, reason="Conflict")
            return self._store((namespace, name), body)

    # ---- for tests ---------------------------------------------------------------------------------

    def lease(self, namespace: str, name: str) -> Any:
        with self._lock:
            lease = self._leases.get((namespace, name))
            return None if lease is None else lease.model_copy(deep=True)

    def overwrite(
        self, namespace: str, name: str, annotations: dict[str, str] | None = None, **spec: Any
    ) -> None:
        """Another client writes the Lease (new resourceVersion), e.g. an admin or another elector:
        ``spec`` fields, and ``annotations`` merged into the metadata's."""
        with self._lock:
            lease = self._leases[(namespace, name)].model_copy(deep=True)
            for key, value in spec.items():
                setattr(lease.spec, key, value)
            if annotations:
                lease.metadata.annotations = {**(lease.metadata.annotations or {}), **annotations}
            self._store((namespace, name), lease)

    # ---- internals ---------------------------------------------------------------------------------

    def _enter(self, call: str) -> None:
        self.calls.append(call)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise ApiException(status=self.fail_status, reason="Internal Server Error")

    def _store(self, key: tuple[str, str], body: Any) -> Any:
        self._rv += 1
        lease = body.model_copy(deep=True)
        lease.metadata.resource_version = str(self._rv)
        lease.metadata.namespace = key[0]
        self._leases[key] = lease
        return lease.model_copy(deep=True)

    @staticmethod
    def _check_wire_format(body: Any) -> None:
        wire = client.ApiClient().sanitize_for_serialization(body)
        for field in ("acquireTime", "renewTime"):
            value = wire.get("spec", {}).get(field)
            if value is not None and not MICRO_TIME.match(value):
                raise ApiException(status=400, reason=f"spec.{field}: cannot parse {value!r} as MicroTime")
