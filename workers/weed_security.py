"""The ``security.toml`` that ``weed mini`` reads from its working directory, written afresh at each start.

HTTP: the filer and volume servers take reads and writes only with a JWT signed by keys that only weed holds.
gRPC: the master, volume, filer, S3 and admin servers take a connection only from a client whose certificate
the stack's private CA signed (mutual TLS). The CA's key signs one certificate per weed component and is then
dropped, never written, so no one can mint another. Every file is mode 0600 in the stack's own directory.

Certificates are made in-process with ``cryptography`` (ECDSA P-256 keys: tens of milliseconds a start), so
no ``openssl`` command need be installed where the stack runs.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from host.files import write_atomic
from host.processes import HOST

SECURITY_FILE = "security.toml"
CA_FILE = "ca.crt"
JWT_SECTIONS = ("signing", "signing.read", "filer_signing", "filer_signing.read")
GRPC_SERVERS = ("master", "volume", "filer", "s3", "admin")
"""weed mini's gRPC servers: each serves with its own certificate and dials the others with it."""
GRPC_CLIENTS = ("worker", "client")
"""Sections for components that only dial: mini's maintenance worker, and ``grpc.client`` (the S3 gateway's
calls to the filer, mini's bucket set-up, and any outside client such as the tests)."""
VALIDITY = timedelta(days=3650)  # a new CA at every start; a stack left running must not see its certs expire


@dataclass(frozen=True)
class GrpcTlsFiles:
    """What a gRPC client of the stack's weed needs: the CA to trust and a certificate and key it signed."""

    ca: Path
    cert: Path
    key: Path


def grpc_tls_files(conf_dir: Path, component: str = "client") -> GrpcTlsFiles:
    """The files ``write_weed_security(conf_dir)`` wrote for ``component`` (``client``: any outside client)."""
    return GrpcTlsFiles(conf_dir / CA_FILE, conf_dir / f"{component}.crt", conf_dir / f"{component}.key")


def write_weed_security(conf_dir: Path) -> Path:
    """Fresh JWT keys, a fresh CA and component certificates, and the ``security.toml`` naming them."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    sections = [f'[jwt.{name}]\nkey = "{secrets.token_hex(32)}"\n' for name in JWT_SECTIONS]
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate("dgrpo-stack-ca", ca_key.public_key(), ca_key, None)
    write_atomic(conf_dir / CA_FILE, ca_cert.public_bytes(serialization.Encoding.PEM), mode=0o600)
    sections.append(f"[grpc]\nca = {_toml_str(conf_dir / CA_FILE)}\n")
    for component in GRPC_SERVERS + GRPC_CLIENTS:
        files = grpc_tls_files(conf_dir, component)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(f"dgrpo-weed-{component}", key.public_key(), ca_key, ca_cert)
        write_atomic(files.cert, cert.public_bytes(serialization.Encoding.PEM), mode=0o600)
        pem_key = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_atomic(files.key, pem_key, mode=0o600)
        sections.append(f"[grpc.{component}]\ncert = {_toml_str(files.cert)}\nkey = {_toml_str(files.key)}\n")
    return write_atomic(conf_dir / SECURITY_FILE, "\n".join(sections), mode=0o600)


def _certificate(
    common_name: str,
    public_key: ec.EllipticCurvePublicKey,
    signing_key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
) -> x509.Certificate:
    """A self-signed CA certificate (``issuer`` None), else a leaf for both ends of a connection."""
    now = datetime.now(UTC)
    is_ca = issuer is None
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))  # a clock a little behind still accepts it
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=0 if is_ca else None), critical=True)
        .add_extension(_key_usage(is_ca), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()), critical=False
        )
    )
    if not is_ca:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _key_usage(is_ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not is_ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=is_ca,
        crl_sign=is_ca,
        encipher_only=False,
        decipher_only=False,
    )


def _toml_str(path: Path) -> str:
    """A TOML basic string: JSON's escapes are TOML's."""
    return json.dumps(str(path))
