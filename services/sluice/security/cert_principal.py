"""A client certificate's principal: Kafka's ``ssl.principal.mapping.rules`` (docs/security.md, "TLS").

The rules (``--tls-principal-rules``) are a comma-separated list, tried in order; the first that
matches gives the principal:

- ``RULE:pattern/replacement/`` matches the *whole* name against the regular expression ``pattern``
  and returns ``replacement`` with ``$1``, ``$2``... (Java's spelling, as in Kafka) filled from its
  groups; a trailing ``L`` or ``U`` (``RULE:pattern/replacement/L``) lower- or upper-cases it;
- ``DEFAULT`` returns the name as it is.

No rule matching gives None: the certificate names no principal (the authenticator refuses it).

The name the rules see is the subject DN in RFC 2253 form (``CN=alice,OU=eng,O=corp``), as Kafka's.
A certificate whose subject has no CN (SPIFFE and many workload identities put the identity in a
SAN only) is seen as its first SAN instead, preferring a URI, then a DNS name, then an e-mail
address: ``spiffe://cluster.local/ns/spark/sa/executor`` becomes the name the rules map.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import NameOID

from sluice.errors import InvalidArgument

__all__ = ["PrincipalMapper", "certificate_name"]

#: One rule, as Kafka parses it: DEFAULT, or RULE:pattern/replacement/flags with ``\/`` escapes.
_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|$)")
#: Java's group references in a replacement: ``$1``.
_JAVA_GROUP = re.compile(r"\$(\d+)")
#: PEM certificates already parsed (a gRPC auth context carries the PEM on every call).
_CACHE_MAX = 1024


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        out = self.pattern.sub(self.replacement, name)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


def _parse(rules: str) -> tuple[_Rule, ...]:
    text = rules.strip()
    if not text:
        return (_Rule(None),)
    out: list[_Rule] = []
    pos = 0
    while pos < len(text):
        match = _RULE.match(text, pos)
        if match is None or match.end() == pos:
            raise InvalidArgument(f"tls_principal_rules: cannot parse {text[pos:]!r}")
        pos = match.end()
        if match.group(1):
            out.append(_Rule(None))
            continue
        pattern = match.group(2).replace("\\/", "/")
        replacement = _JAVA_GROUP.sub(r"\\g<\1>", match.group(3).replace("\\/", "/"))
        try:
            out.append(_Rule(re.compile(pattern), replacement, match.group(4)))
        except re.error as exc:
            raise InvalidArgument(f"tls_principal_rules: bad pattern {pattern!r}: {exc}") from exc
    return tuple(out)


def certificate_name(cert: x509.Certificate) -> str:
    """The name the rules see (the module docstring): the RFC 2253 subject, or the first SAN
    when the subject has no CN."""
    subject = cert.subject
    if subject.get_attributes_for_oid(NameOID.COMMON_NAME):
        return subject.rfc4514_string()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return subject.rfc4514_string()
    for kind in (x509.UniformResourceIdentifier, x509.DNSName, x509.RFC822Name):
        values: Sequence[str] = san.get_values_for_type(kind)
        if values:
            return values[0]
    return subject.rfc4514_string()


class PrincipalMapper:
    """``--tls-principal-rules`` compiled once; maps a peer's certificate to a principal name."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self._rules = _parse(rules)
        self._by_pem: dict[bytes, str | None] = {}

    def map_name(self, name: str) -> str | None:
        """The first matching rule's result for ``name``; None when no rule matches."""
        for rule in self._rules:
            out = rule.apply(name)
            if out is not None:
                return out or None
        return None

    def map_certificate(self, cert: x509.Certificate) -> str | None:
        return self.map_name(certificate_name(cert))

    def principal_from_grpc_auth_context(self, auth_context: Mapping[str, Iterable[bytes]]) -> str | None:
        """From a ``grpc.aio`` ``context.auth_context()``: None without a verified client
        certificate. gRPC fills ``x509_pem_cert`` only for a certificate it verified; it is parsed
        here (not ``x509_subject``, whose DN spelling is OpenSSL's) so both transports name a
        certificate alike. Parsed certificates are cached: a call costs a dictionary lookup."""
        pem = next(iter(auth_context.get("x509_pem_cert", ())), None)
        if not pem:
            return None
        if pem in self._by_pem:
            return self._by_pem[pem]
        try:
            principal = self.map_certificate(x509.load_pem_x509_certificate(pem))
        except ValueError:
            principal = None
        if len(self._by_pem) >= _CACHE_MAX:
            self._by_pem.clear()
        self._by_pem[pem] = principal
        return principal

    def principal_from_peer_cert(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
        """From a wire connection's ``transport.get_extra_info("ssl_object")``: None on a
        plaintext connection or without a (verified) client certificate. Once per connection."""
        if ssl_object is None:
            return None
        der = ssl_object.getpeercert(binary_form=True)
        if not der:
            return None
        try:
            return self.map_certificate(x509.load_der_x509_certificate(der))
        except ValueError:
            return None
