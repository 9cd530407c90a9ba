"""Kafka over TLS and SASL, and the SASL password kept out of sight.

The end-to-end test runs the real aiokafka client against a listener on 127.0.0.1 that
does what a broker does up to authentication: a TLS handshake that requires a client
certificate signed by the test CA, ApiVersions, SaslHandshake and SaslAuthenticate
(PLAIN). It records what it received and then refuses the credentials with an error
message that quotes them back, as a careless broker might. The test broker the other
Kafka tests use speaks neither TLS nor SASL.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import ssl
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiokafka.protocol.admin import (
    ApiVersionResponse_v0,
    ApiVersionResponse_v1,
    SaslAuthenticateResponse_v0,
    SaslHandShakeResponse_v1,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from events.errors import InputError, LogError
from events.kafka import KafkaLog, KafkaSettings
from events.kafka_settings import SecretFilter
from shards.bus import open_bus

PASSWORD = "hunter2-Zq9!x'\"é"  # quotes and a non-ASCII letter: escaped in reprs
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36


# ---------------------------------------------------------------------------- settings


def _password_file(tmp_path: Path, text: str = PASSWORD + "\n") -> Path:
    path = tmp_path / "password"
    path.write_text(text)
    return path


def test_the_password_is_read_from_a_file_and_never_shown(tmp_path: Path) -> None:
    path = _password_file(tmp_path)
    s = KafkaSettings.from_url(
        "kafka://h:9093?security_protocol=SASL_PLAINTEXT&sasl_mechanism=SCRAM-SHA-512",
        env={"SHOAL_KAFKA_SASL_USERNAME": "u", "SHOAL_KAFKA_SASL_PASSWORD_FILE": str(path)},
    )
    options = s.client_options()
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "u"
    assert options["sasl_plain_password"] == PASSWORD, "the final newline is not part of it"
    assert PASSWORD not in repr(s) and PASSWORD not in repr(KafkaLog(s))
    path.write_text("rotated\n")
    assert s.client_options()["sasl_plain_password"] == "rotated", "read at every connect"


@pytest.mark.parametrize(
    ("url", "env", "message"),
    [
        (
            f"kafka://u:{PASSWORD}@h:1?security_protocol=SASL_SSL",
            {},
            "credentials in the bus URL are refused",
        ),
        (f"kafka://h:1?sasl_password={PASSWORD}", {}, "sasl_password in the bus URL is refused"),
        ("kafka://h:1", {"SHOAL_KAFKA_SASL_PASSWORD": PASSWORD}, "SASL_PASSWORD is refused"),
    ],
)
def test_a_password_anywhere_but_a_file_is_refused_without_quoting_it(
    url: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(InputError, match=message) as info:
        KafkaSettings.from_url(url, env=env)
    assert PASSWORD not in str(info.value)
    assert "sasl_password_file" in str(info.value), "the refusal says what to do instead"


@settings(max_examples=60, deadline=None)
@given(
    secret=st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="&#/?@%\x00"),
        min_size=12,
        max_size=40,
    )
)
def test_no_refusal_quotes_the_password(secret: str) -> None:
    """Whatever the password, a URL or variable carrying it is refused, and the
    refusal, which names the setting, is the same whatever the password (one of a
    few fixed texts): it cannot contain it."""

    def refusal(password: str) -> list[str]:
        messages = []
        for url, env in (
            (f"kafka://u:{password}@h:1", {}),
            (f"kafka://h:1?sasl_password={password}", {}),
            ("kafka://h:1", {"SHOAL_KAFKA_SASL_PASSWORD": password}),
        ):
            with pytest.raises(InputError) as info:
                KafkaSettings.from_url(url, env=env)
            messages.append(str(info.value))
        return messages

    unparsable = (
        "--bus: expected kafka://HOST:PORT, got a URL that does not parse (an unbalanced "
        "[ or ], or a character that is not allowed in the host part)"
    )
    for got, usual in zip(refusal(secret), refusal("x" * 12), strict=True):
        assert got in (usual, unparsable)  # "[", "]" or some letters make it unparsable


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "No such file"), ("", "empty"), ("x" * 5000, "longer than"), (b"\xff\xfe", "UTF-8")],
)
def test_an_unusable_password_file_is_named(
    tmp_path: Path, content: str | bytes | None, message: str
) -> None:
    path = tmp_path / "password"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    url = (
        "kafka://h:1?security_protocol=SASL_SSL&sasl_mechanism=PLAIN&sasl_username=u"
        f"&sasl_password_file={path}"
    )
    with pytest.raises(InputError, match=message) as info:
        KafkaSettings.from_url(url, env={})
    assert str(path) in str(info.value)


def test_sasl_needs_a_password_file() -> None:
    with pytest.raises(InputError, match="sasl_password_file"):
        KafkaSettings.from_url(
            "kafka://h:1?security_protocol=SASL_SSL&sasl_mechanism=PLAIN&sasl_username=u",
            env={},
        )


def test_unusable_tls_files_are_named(tmp_path: Path) -> None:
    s = KafkaSettings.from_url(
        f"kafka://h:1?security_protocol=SSL&ssl_cafile={tmp_path}/ca.pem", env={}
    )
    with pytest.raises(InputError, match=r"ssl_cafile .*ca\.pem"):
        s.client_options()


def test_the_log_filter_hides_every_printed_form() -> None:
    hide = SecretFilter()
    hide.add(PASSWORD)
    for arg in (PASSWORD, repr(PASSWORD), b"\x00u\x00u\x00" + PASSWORD.encode()):
        record = logging.LogRecord("aiokafka.conn", logging.DEBUG, "", 0, "sent %s", (arg,), None)
        assert hide.filter(record)
        assert PASSWORD not in record.getMessage()
        assert repr(PASSWORD.encode())[2:-1] not in record.getMessage()
        assert "***" in record.getMessage()


# ---------------------------------------------------------------------------- TLS + SASL


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    ip: str | None = None,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer if issuer else (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if ip:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("shoal-test-ca", ca_key, None, ca=True)
    issuer = (ca.subject, ca_key)
    files: dict[str, Path] = {}
    for name, cert_key, cert in (
        ("ca", ca_key, ca),
        *(
            (who, k, _certificate(cn, k, issuer, ip=ip))
            for who, cn, ip, k in (
                ("server", "broker", "127.0.0.1", ec.generate_private_key(ec.SECP256R1())),
                ("client", "shoal-client", None, ec.generate_private_key(ec.SECP256R1())),
            )
        ),
    ):
        files[f"{name}.crt"] = root / f"{name}.crt"
        files[f"{name}.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{name}.key"] = root / f"{name}.key"
        files[f"{name}.key"].write_bytes(
            cert_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return Pki(
        files["ca.crt"],
        files["server.crt"],
        files["server.key"],
        files["client.crt"],
        files["client.key"],
    )


@dataclass
class SaslBroker:
    """Answers ApiVersions, SaslHandshake (PLAIN) and SaslAuthenticate, then refuses."""

    pki: Pki
    peers: list[str] = field(default_factory=list)
    mechanisms: list[str] = field(default_factory=list)
    tokens: list[bytes] = field(default_factory=list)
    port: int = 0
    handlers: set[asyncio.Task[None]] = field(default_factory=set)
    server: asyncio.Server | None = None

    async def start(self) -> asyncio.Server:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.pki.ca))
        context.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        context.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no connection
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.server

    async def stop(self) -> None:
        """Close the listener and every connection still open, and wait for them."""
        assert self.server is not None
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        peer = writer.get_extra_info("peercert") or {}
        self.peers.extend(v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName")
        try:
            for _ in range(10):  # a bounded conversation
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                request = await reader.readexactly(size)
                api_key, version, correlation = struct.unpack(">hhi", request[:8])
                (client_len,) = struct.unpack(">h", request[8:10])
                body = request[10 + max(client_len, 0) :]
                if api_key == API_VERSIONS:
                    versions = [
                        (API_VERSIONS, 0, 1),
                        (SASL_HANDSHAKE, 0, 1),
                        (SASL_AUTHENTICATE, 0, 0),
                    ]
                    answer = (
                        ApiVersionResponse_v0(error_code=0, api_versions=versions)
                        if version == 0
                        else ApiVersionResponse_v1(
                            error_code=0, api_versions=versions, throttle_time_ms=0
                        )
                    ).encode()
                elif api_key == SASL_HANDSHAKE:
                    (length,) = struct.unpack(">h", body[:2])
                    self.mechanisms.append(body[2 : 2 + length].decode())
                    answer = SaslHandShakeResponse_v1(
                        error_code=0, enabled_mechanisms=["PLAIN"]
                    ).encode()
                elif api_key == SASL_AUTHENTICATE:
                    (length,) = struct.unpack(">i", body[:4])
                    token = body[4 : 4 + length]
                    self.tokens.append(token)
                    answer = SaslAuthenticateResponse_v0(
                        error_code=58,  # SASL_AUTHENTICATION_FAILED
                        error_message=f"bad credentials {token.decode(errors='replace')}",
                        sasl_auth_bytes=b"",
                    ).encode()
                else:
                    return
                reply = struct.pack(">i", correlation) + answer
                writer.write(struct.pack(">i", len(reply)) + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return
        except asyncio.CancelledError:
            return  # stop(): the test is over
        finally:
            writer.close()


async def test_tls_and_sasl_reach_the_broker_and_the_password_shows_nowhere(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = SaslBroker(pki)
    await broker.start()
    password_file = _password_file(tmp_path)
    url = (
        f"kafka://127.0.0.1:{broker.port}?topic=t&security_protocol=SASL_SSL"
        f"&sasl_mechanism=PLAIN&sasl_username=shoal&sasl_password_file={password_file}"
        f"&ssl_cafile={pki.ca}&ssl_certfile={pki.client_cert}&ssl_keyfile={pki.client_key}"
        "&request_timeout_ms=5000"
    )
    caplog.set_level(logging.DEBUG)  # the client's debug logs print every request
    caplog.set_level(logging.DEBUG, logger="aiokafka")  # an earlier `-v` run may have raised it
    try:
        async with asyncio.timeout(60):
            with pytest.raises(LogError) as info:
                await open_bus(url)
    finally:
        await broker.stop()
    assert "shoal-client" in broker.peers, "the client presented its certificate over TLS"
    assert broker.mechanisms and set(broker.mechanisms) == {"PLAIN"}
    assert broker.tokens, "the client authenticated"
    assert broker.tokens[0].split(b"\x00")[1:] == [b"shoal", PASSWORD.encode()], (
        "the password from the file reached the broker"
    )
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "SaslAuthenticate" in logged, "the request was logged (with its bytes hidden)"
    for text in (str(info.value), logged):
        assert PASSWORD not in text
        assert repr(PASSWORD.encode())[2:-1] not in text
        assert repr(PASSWORD)[1:-1] not in text


async def test_tls_refuses_a_broker_the_ca_did_not_sign(pki: Pki, tmp_path: Path) -> None:
    """The CA file is used to verify the broker: trusting another CA, the client never
    gets as far as sending credentials."""
    broker = SaslBroker(pki)
    await broker.start()
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = tmp_path / "other-ca.crt"
    other.write_bytes(
        _certificate("other-ca", other_key, None, ca=True).public_bytes(serialization.Encoding.PEM)
    )
    settings_ = KafkaSettings(
        bootstrap=f"127.0.0.1:{broker.port}",
        security_protocol="SSL",
        ssl_cafile=str(other),
        request_timeout_ms=5000,
    )
    try:
        async with asyncio.timeout(60):
            with pytest.raises(LogError):
                await KafkaLog(settings_).start()
    finally:
        await broker.stop()
    assert not broker.mechanisms and not broker.tokens
