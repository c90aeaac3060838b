"""Certificates for the listener TLS tests and bench: a CA, a server and clients (``cryptography``).

Imported as ``tests.store_node.tls_certs``.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pair:
    """A PEM certificate and key on disk, and the certificate's SHA-256 fingerprint."""

    cert: Path
    key: Path
    fingerprint: str


@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate for 127.0.0.1 and localhost, two clients it signed, and
    a client signed by another CA."""

    ca: Path
    server: Pair
    client: Pair
    other_client: Pair
    stranger: Pair


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(
    folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Pair:
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    digest = cert.fingerprint(hashes.SHA256()).hex()
    return Pair(cert_path, key_path, digest)


def _ca(common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    common: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    *,
    server: bool,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(ca[1], hashes.SHA256()), key


def make_certs(folder: Path) -> Certs:
    """Write the test PKI into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca("chorus test CA")
    other = _ca("another CA")
    (folder / "ca.pem").write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    return Certs(
        ca=folder / "ca.pem",
        server=_write(folder, "server", *_leaf("store node", ca, server=True)),
        client=_write(folder, "client", *_leaf("phone", ca, server=False)),
        other_client=_write(folder, "other", *_leaf("other phone", ca, server=False)),
        stranger=_write(folder, "stranger", *_leaf("stranger", other, server=False)),
    )
