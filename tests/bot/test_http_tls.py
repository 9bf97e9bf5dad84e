"""Native TLS (``http.tls_cert``/``http.tls_key``): a real HTTPS client against a self-signed certificate made here,
and the files that are refused at start, each in one line."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tests.bot.test_http_fakes import start

from bot.config import ConfigError, config_from_dict


def make_cert(folder: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_the_api_speaks_https_with_the_configured_certificate(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    srv = await start(tmp_path, http={"tls_cert": str(cert), "tls_key": str(key)})
    port = srv.runner.addresses[0][1]
    try:
        trust = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://127.0.0.1:{port}/healthz", ssl=trust) as r:
                assert r.status == 200 and (await r.json())["status"] == "ok"
            async with s.post(f"https://localhost:{port}/tts", ssl=trust,
                              json={"text": "Hello.", "text_lang": "en", "ref_audio_path": "bob"}) as r:
                assert r.status == 200 and (await r.read())[:4] == b"RIFF"
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # the client checks the certificate
                async with s.get(f"https://127.0.0.1:{port}/healthz") as r:
                    pass
            with pytest.raises(aiohttp.ClientError):  # plain HTTP on the TLS port is not served
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    await r.read()
    finally:
        await srv.close()


def _start_error(tmp_path: Path, cert: Path, key: Path) -> str:
    with pytest.raises(ConfigError) as e:
        asyncio.run(start(tmp_path, http={"tls_cert": str(cert), "tls_key": str(key)}))
    message = str(e.value)
    assert "\n" not in message
    return message


def test_unusable_tls_files_are_refused_at_start_in_one_line(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    other_cert, other_key = make_cert(tmp_path, "other")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    assert "does not exist" in _start_error(tmp_path, tmp_path / "missing.crt", key)
    assert "http.tls_key" in _start_error(tmp_path, cert, tmp_path / "missing.key")
    assert "is not the key of http.tls_cert" in _start_error(tmp_path, cert, other_key)
    assert "is not a PEM certificate" in _start_error(tmp_path, garbage, key)
    assert "is empty" in _start_error(tmp_path, empty, key)
    assert "is a folder" in _start_error(tmp_path, tmp_path, key)
    encrypted = tmp_path / "encrypted.key"
    loaded = serialization.load_pem_private_key(other_key.read_bytes(), None)
    encrypted.write_bytes(loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.BestAvailableEncryption(b"secret")))
    assert "is encrypted" in _start_error(tmp_path, other_cert, encrypted)


def test_a_certificate_without_its_key_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="http.tls_cert and tls_key go together"):
        config_from_dict({"http": {"tls_cert": "server.crt"}}, base_dir=tmp_path)
