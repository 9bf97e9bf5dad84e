"""Native TLS for the HTTP API: ``http.tls_cert`` and ``http.tls_key`` (PEM) as a server SSL context.

A reverse proxy (Caddy, nginx) is the usual way to serve HTTPS; this is for a single machine without one. Files that
are missing, unreadable, not PEM or not a pair are refused at start in one line, before any model loads.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Callable

from bot.config import ConfigError, HttpConfig


def server_context(http: HttpConfig) -> ssl.SSLContext | None:
    """The SSL context for ``http.tls_cert``/``http.tls_key``, or None when TLS is off (both unset).

    Raises
    ------
    ConfigError
        A file is missing or unreadable, is not a PEM certificate/key, or the key does not belong to the
        certificate; the message names the file and the fix.
    """
    if http.tls_cert is None or http.tls_key is None:
        return None
    for key, path in (("http.tls_cert", http.tls_cert), ("http.tls_key", http.tls_key)):
        _check_readable(key, Path(path))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # a server context, TLS 1.2+ (Python's floor)
    try:
        context.load_cert_chain(str(http.tls_cert), str(http.tls_key), password=_encrypted(http.tls_key))
    except ssl.SSLError as e:
        reason = e.reason or str(e)
        if "KEY_VALUES_MISMATCH" in str(reason):
            raise ConfigError(f"http.tls_key {http.tls_key} is not the key of http.tls_cert {http.tls_cert}: give "
                              "the private key the certificate was made for") from None
        raise ConfigError(f"http.tls_cert {http.tls_cert} or http.tls_key {http.tls_key} is not a PEM certificate "
                          f"and key ({reason}): give the PEM files (-----BEGIN ...)") from None
    except OSError as e:
        raise ConfigError(f"http.tls_cert/http.tls_key cannot be loaded ({e.strerror or e})") from None
    return context


def _encrypted(path: Path) -> Callable[[], str]:
    """A password callback that refuses: without one, OpenSSL would ask for the passphrase on the terminal."""
    def refuse() -> str:
        raise ConfigError(f"http.tls_key {path} is encrypted: give an unencrypted PEM key (e.g. `openssl pkey -in "
                          "KEY -out plain.pem`), readable only by the user running voicebot")

    return refuse


def _check_readable(key: str, path: Path) -> None:
    """Refuse a missing or unreadable file in one line (ssl's own errors do not say which file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1)
    except FileNotFoundError:
        raise ConfigError(f"{key} {path} does not exist: give the PEM file's path, or remove {key}") from None
    except IsADirectoryError:
        raise ConfigError(f"{key} {path} is a folder: give the PEM file's path") from None
    except OSError as e:
        raise ConfigError(f"{key} {path} cannot be read ({e.strerror or e}): let the user running voicebot "
                          "read it") from None
    if not head:
        raise ConfigError(f"{key} {path} is empty: give the PEM file's path")
