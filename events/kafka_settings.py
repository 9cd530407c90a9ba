"""How shoal reaches Kafka: ``KafkaSettings`` from a ``--bus`` URL and ``SHOAL_KAFKA_*``
variables, TLS files, and the SASL password, which is read from a file only.

The SASL password is read from ``sasl_password_file`` (e.g. a mounted Kubernetes
Secret) at every (re)connect, so a rotated Secret is picked up. It is never taken from
the URL, a query parameter or an environment variable's value (those show up in process
arguments, logs and crash reports), and it never appears in a ``repr``, a log line or an
error message: errors that could quote it have it replaced by ``***``.

No aiokafka here: ``events.kafka`` hands ``client_options()`` to the clients.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from events.errors import InputError

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
ENV_PREFIX = "SHOAL_KAFKA_"
NOT_A_SECRET_HOLDER = (
    "the SASL password is read only from a file: put it in one (a mounted Secret) and "
    "name it with sasl_password_file or SHOAL_KAFKA_SASL_PASSWORD_FILE"
)
MAX_PASSWORD_BYTES = 4096


@dataclass(frozen=True)
class KafkaSettings:
    """Where the log lives and how to reach it."""

    bootstrap: str
    topic: str = "shoal-events"
    partitions: int = 1
    client_id: str = "shoal"
    acks: str = "all"
    idempotence: bool = True
    """The producer's idempotence (needs ``acks=all``): a batch the producer sends again
    after a lost answer is written once. ``false`` for a broker that cannot do it."""
    transactions: bool | None = None
    """Whether a leader term's appends go through a transactional producer of the
    term's own (``events.kafka``), so that the broker refuses a deposed leader's late
    appends. Unset: on where ``idempotence`` is (a transactional producer is
    idempotent); ``false`` for a broker without transactions, whose readers then drop
    such records instead."""
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password_file: str | None = None
    fetch_max_wait_ms: int = 10
    """How long the broker may hold a fetch at the end of the log (each read asks
    where the log ends this way)."""
    catch_up_wait_ms: int = 2000
    """How long the broker may take to gather a read's records. Kafka answers as soon
    as it has some; a broker that stops gathering at this wait (one that lists every
    stored batch of the partition at each fetch) needs it long enough."""
    linger_ms: int = 2
    request_timeout_ms: int = 30000
    max_batch_bytes: int = 900_000

    @classmethod
    def from_url(cls, url: str, env: Mapping[str, str] | None = None) -> KafkaSettings:
        """``kafka://HOST:PORT[,HOST:PORT]?topic=T&partitions=N&security_protocol=...``.

        Query parameters and ``SHOAL_KAFKA_*`` environment variables (the URL wins) set
        any field. The SASL password is not a field: ``sasl_password_file`` names the
        file holding it; a password in the URL (``user:password@`` or
        ``sasl_password=``) or in ``SHOAL_KAFKA_SASL_PASSWORD`` is refused, and the
        refusal does not quote it.
        """
        try:
            parts = urlsplit(url)
        except ValueError:  # urllib's message quotes the host part, password and all
            raise InputError(
                "expected kafka://HOST:PORT, got a URL that does not parse (an unbalanced "
                "[ or ], or a character that is not allowed in the host part)",
                location="--bus",
            ) from None
        if parts.scheme != "kafka" or not parts.netloc:
            raise InputError(
                f"expected kafka://HOST:PORT, got {redact_url(url)!r}", location="--bus"
            )
        if "@" in parts.netloc:
            raise InputError(
                "credentials in the bus URL are refused (they show in process arguments "
                f"and logs); {NOT_A_SECRET_HOLDER}",
                location="--bus",
            )
        values: dict[str, str] = {}
        environment = os.environ if env is None else env
        for key, value in environment.items():
            if key.startswith(ENV_PREFIX):
                values[key[len(ENV_PREFIX) :].lower()] = value
        if "sasl_password" in values:
            raise InputError(
                f"{ENV_PREFIX}SASL_PASSWORD is refused; {NOT_A_SECRET_HOLDER}",
                location="environment",
            )
        for key, items in parse_qs(parts.query, keep_blank_values=True).items():
            if key == "sasl_password":
                raise InputError(
                    f"sasl_password in the bus URL is refused; {NOT_A_SECRET_HOLDER}",
                    location="--bus",
                )
            values[key] = items[-1]
        known = {f for f in cls.__dataclass_fields__ if f != "bootstrap"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(f"unknown Kafka setting {unknown[0]!r}", location="--bus")
        kwargs: dict[str, Any] = {"bootstrap": parts.netloc}
        for key, raw in values.items():
            kind = cls.__dataclass_fields__[key].type
            try:
                if "int" in str(kind) and "str" not in str(kind):
                    kwargs[key] = int(raw)
                elif "bool" in str(kind):
                    if raw.lower() not in ("true", "false", "1", "0"):
                        raise ValueError(raw)
                    kwargs[key] = raw.lower() in ("true", "1")
                else:
                    kwargs[key] = raw
            except ValueError:
                raise InputError(f"bad value {raw!r} for {key}", location="--bus") from None
        settings = cls(**kwargs)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.partitions < 1:
            raise InputError("partitions must be at least 1", location="--bus")
        if self.security_protocol not in PROTOCOLS:
            raise InputError(
                f"security_protocol must be one of {', '.join(PROTOCOLS)}", location="--bus"
            )
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise InputError(
                    f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}", location="--bus"
                )
            if not self.sasl_username or not self.sasl_password_file:
                raise InputError(
                    "SASL needs sasl_username and sasl_password_file", location="--bus"
                )
            self.sasl_password()  # readable now, not at the first reconnect
        if self.acks not in ("all", "0", "1", "-1"):
            raise InputError("acks must be all, 0, 1 or -1", location="--bus")
        if self.idempotence and self.acks not in ("all", "-1"):
            raise InputError(
                f"acks={self.acks} needs idempotence=false (an idempotent producer "
                "waits for all replicas)",
                location="--bus",
            )
        if self.transactions and not self.idempotence:
            raise InputError(
                "transactions=true needs idempotence (a transactional producer is "
                "idempotent); set transactions=false with idempotence=false",
                location="--bus",
            )

    @property
    def transactional(self) -> bool:
        """Whether leader terms write through transactional producers."""
        return self.idempotence if self.transactions is None else self.transactions

    def sasl_password(self) -> str:
        """The password in ``sasl_password_file`` (one line; a final newline is not
        part of it). Read at every call, so a rotated Secret is picked up at the next
        connect. Errors name the file and never quote what is in it."""
        path = self.sasl_password_file
        if not path:
            raise InputError("no sasl_password_file", location="--bus")
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_PASSWORD_BYTES + 1)
        except OSError as exc:
            raise InputError(
                f"sasl_password_file {path}: {exc.strerror or type(exc).__name__}",
                location="--bus",
            ) from None
        if len(data) > MAX_PASSWORD_BYTES:
            raise InputError(
                f"sasl_password_file {path}: longer than {MAX_PASSWORD_BYTES} bytes",
                location="--bus",
            )
        try:
            password = data.decode().removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError:
            raise InputError(
                f"sasl_password_file {path}: not UTF-8 text", location="--bus"
            ) from None
        if not password:
            raise InputError(f"sasl_password_file {path}: empty", location="--bus")
        return password

    def client_options(self) -> dict[str, Any]:
        """Connection options shared by producer, consumer and admin client. The only
        place the SASL password is handed on, to aiokafka itself."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap.split(","),
            "client_id": self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            options["ssl_context"] = self.ssl_context()
        if self.security_protocol.startswith("SASL"):
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password()
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """Verify the broker against ``ssl_cafile`` (the system's CAs without one) and
        present ``ssl_certfile``/``ssl_keyfile`` as the client's certificate."""
        try:
            context = ssl.create_default_context(cafile=self.ssl_cafile)
            if self.ssl_certfile:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        except (OSError, ssl.SSLError) as exc:
            files = ", ".join(
                f"{name} {value}"
                for name, value in (
                    ("ssl_cafile", self.ssl_cafile),
                    ("ssl_certfile", self.ssl_certfile),
                    ("ssl_keyfile", self.ssl_keyfile),
                )
                if value
            )
            raise InputError(
                f"TLS files unusable ({files}): {getattr(exc, 'strerror', None) or exc}",
                location="--bus",
            ) from None
        return context


def redact_url(url: str) -> str:
    """``url`` fit to print: any ``user:password@`` and ``sasl_password=`` value hidden
    (``kafka://***`` for one that does not parse)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "kafka://***"
    netloc = parts.netloc.rpartition("@")[2] if "@" in parts.netloc else parts.netloc
    if "@" in parts.netloc:
        netloc = "***@" + netloc
    query = "&".join(
        f"{k}=***" if k == "sasl_password" else f"{k}={v}"
        for k, v in ((p.partition("=")[0], p.partition("=")[2]) for p in parts.query.split("&"))
        if k
    )
    return parts._replace(netloc=netloc, query=query).geturl()


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***``."""
    return text.replace(secret, "***") if secret else text


class SecretFilter(logging.Filter):
    """Hides the secrets it holds in every record of the loggers it is attached to, in
    the forms a client prints them: as text, as ``repr`` of the text, as ``repr`` of
    its UTF-8 bytes (aiokafka logs each request at debug level, a SASL PLAIN
    ``SaslAuthenticateRequest`` with the password in its bytes among them), in the
    message and in a logged traceback."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: set[str] = set()

    def add(self, secret: str) -> None:
        self.forms.update({secret, repr(secret)[1:-1], repr(secret.encode())[2:-1]})
        self.forms.discard("")

    def _clean(self, text: str) -> str:
        for form in sorted(self.forms, key=len, reverse=True):
            text = text.replace(form, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.forms:
            return True
        message = record.getMessage()
        cleaned = self._clean(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._clean(record.exc_text)
        return True


SECRETS = SecretFilter()
"""The one filter on the Kafka client's loggers: it holds every password handed on."""


def guard_client_logs(secret: str | None, prefix: str = "aiokafka") -> None:
    """Hide ``secret`` from every logger under ``prefix`` (filters on a logger do not
    apply to its children, so each gets the filter; the client's modules, imported by
    now, have created theirs)."""
    if not secret:
        return
    SECRETS.add(secret)
    names = [prefix, *(n for n in logging.root.manager.loggerDict if n.startswith(prefix + "."))]
    for name in names:
        logger = logging.getLogger(name)
        if SECRETS not in logger.filters:
            logger.addFilter(SECRETS)


__all__ = ["KafkaSettings", "SecretFilter", "guard_client_logs", "redact", "redact_url"]
