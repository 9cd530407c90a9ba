"""Who may call ``shoal extender``: a bearer token, client certificates (mTLS), or
nobody beyond the machine.

kube-scheduler's extender client speaks HTTPS with the ``tlsConfig`` of its
``extenders`` entry: ``caFile`` (the CA that signed this server's certificate) and
``certFile``/``keyFile`` (its own client certificate). Served with ``--tls-cert`` and
``--tls-key``, and ``--client-ca`` naming the CA that signed kube-scheduler's client
certificate, the server asks every client for a certificate: a certificate that does not
verify fails the handshake, and a client that offers none gets a 401 on every verb
(``/healthz`` stays open, so a kubelet probe, which offers none, still reaches it).

kube-scheduler has no setting for a bearer token; ``--token-file`` serves callers that
do (a proxy in front, a test harness): every verb needs ``Authorization: Bearer
<token>``, compared in constant time. Either is enough; both may be given, and then a
request passes with either.

Without either, the server answers whoever reaches it, so it listens only on a loopback
address (kube-scheduler beside it in the same pod) unless ``--allow-unauthenticated``
says that is meant.
"""

from __future__ import annotations

import hmac
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from events.errors import InputError

MAX_TOKEN_BYTES = 4096


@dataclass(frozen=True)
class Access:
    """What a request must show; no token and no client CA: nothing."""

    token: bytes = b""
    client_certs: bool = False
    """The TLS context asks for client certificates (verified against ``--client-ca``)."""

    @property
    def open(self) -> bool:
        return not self.token and not self.client_certs

    def allows(self, authorization: str | None, peer_cert: object) -> bool:
        """Whether a request with this ``Authorization`` header, over a connection whose
        verified client certificate is ``peer_cert`` (None without one), may call a verb."""
        if self.open:
            return True
        if self.client_certs and peer_cert:
            return True
        if self.token and authorization is not None:
            scheme, _, given = authorization.partition(" ")
            if scheme.lower() == "bearer":
                return hmac.compare_digest(given.strip().encode(), self.token)
        return False


def read_token(path: str) -> bytes:
    """The token in ``path`` (surrounding white space dropped); a missing, empty or
    oversized file is an :class:`InputError`."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", location="--token-file") from None
    token = raw.strip()
    if not token:
        raise InputError(f"{path} is empty", location="--token-file")
    if len(token) > MAX_TOKEN_BYTES or any(c < 0x21 or c > 0x7E for c in token):
        raise InputError(
            f"{path}: a token is at most {MAX_TOKEN_BYTES} printable ASCII characters "
            "without spaces",
            location="--token-file",
        )
    return token


def server_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """TLS for the listening socket: this certificate and key, and with ``client_ca``
    client certificates asked for and verified against it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InputError(
            f"cannot load {cert} with key {key}: {exc}", location="--tls-cert"
        ) from None
    if client_ca:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise InputError(f"cannot load {client_ca}: {exc}", location="--client-ca") from None
        # optional at the handshake (a probe of /healthz offers none); a verb without
        # one is refused (Access.allows)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, access: Access, tls: bool, allow_unauthenticated: bool) -> str:
    """Refuse (:class:`InputError`) to serve everyone on a non-loopback address unless
    told to; a warning to print ("" for none)."""
    if is_loopback(host):
        return ""
    if access.open and not allow_unauthenticated:
        raise InputError(
            f"{host} is reachable from other machines and any caller could bind any pod: "
            "give --token-file or --client-ca (with --tls-cert), or --allow-unauthenticated",
            location="--listen",
        )
    if access.token and not tls:
        return "--token-file without --tls-cert: the token crosses the network in clear text"
    return ""


__all__ = ["Access", "check_exposure", "is_loopback", "read_token", "server_context"]
