"""The ``security.toml`` the embedded stack's weed reads: what it names exists, is private, and chains to a CA
whose key was never written. (That weed enforces it is tests/security/test_store_needs_keys.py's part.)"""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from workers.weed_security import (
    GRPC_CLIENTS,
    GRPC_SERVERS,
    JWT_SECTIONS,
    grpc_tls_files,
    write_weed_security,
)


def test_every_grpc_component_has_a_certificate_from_a_ca_whose_key_is_nowhere(tmp_path: Path) -> None:
    config = tomllib.loads(write_weed_security(tmp_path).read_text())
    ca = x509.load_pem_x509_certificate(Path(config["grpc"]["ca"]).read_bytes())
    assert set(config["grpc"]) == {"ca", *GRPC_SERVERS, *GRPC_CLIENTS}
    for name in JWT_SECTIONS:  # "signing.read" is [jwt.signing.read]
        section = config["jwt"]
        for part in name.split("."):
            section = section[part]
        assert len(section["key"]) == 64
    for component in GRPC_SERVERS + GRPC_CLIENTS:
        section = config["grpc"][component]
        files = grpc_tls_files(tmp_path, component)
        assert (Path(section["cert"]), Path(section["key"])) == (files.cert, files.key)
        x509.load_pem_x509_certificate(files.cert.read_bytes()).verify_directly_issued_by(ca)

    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in tmp_path.iterdir())
    keys = [path.read_bytes() for path in tmp_path.iterdir() if b"PRIVATE KEY" in path.read_bytes()]
    public_keys = [serialization.load_pem_private_key(key, None).public_key() for key in keys]
    assert len(public_keys) == len(GRPC_SERVERS + GRPC_CLIENTS)
    assert ca.public_key() not in public_keys  # no file holds the key that could sign another certificate


def test_each_start_makes_a_new_ca(tmp_path: Path) -> None:
    write_weed_security(tmp_path)
    first = grpc_tls_files(tmp_path).ca.read_bytes()
    write_weed_security(tmp_path)
    assert grpc_tls_files(tmp_path).ca.read_bytes() != first
