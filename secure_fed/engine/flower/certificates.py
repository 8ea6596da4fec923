"""TLS certificates for a Flower deployment: a certificate authority and the SuperLink's certificate.

``secure-fed flower certificates --out certs --host 127.0.0.1 --host superlink.example.org`` writes

* ``ca.crt``: the authority's certificate; every SuperNode (``--root-certificates``) and the ``flwr`` CLI
  (``root-certificates`` in the SuperLink connection) trust it;
* ``ca.key``: the authority's private key (keep it offline; it is needed only to issue more certificates);
* ``server.pem`` and ``server.key``: the SuperLink's certificate, valid for every ``--host`` (IP addresses and DNS
  names as subject alternative names), and its private key (``flower-superlink --ssl-certfile server.pem
  --ssl-keyfile server.key --ssl-ca-certfile ca.crt``).

Keys are P-256 ECDSA; private keys are written with mode 0600. The files are for one deployment: anyone holding
``ca.key`` can impersonate the SuperLink to the nodes.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

FILES = ("ca.crt", "ca.key", "server.pem", "server.key")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "secure-fed"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])  # fmt: skip


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: set it before the key is written
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def generate_certificates(out: str | Path, hosts: list[str], *, days: int = 365) -> dict[str, Path]:
    """Write a CA and a SuperLink certificate for ``hosts`` into ``out``; returns the four paths by name."""
    if not hosts:
        raise ValueError("give at least one --host (the SuperLink's IP address or DNS name)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("secure-fed deployment CA")
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip

    paths = {name: out / name for name in FILES}
    paths["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(paths["ca.key"], ca_key)
    paths["server.pem"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(paths["server.key"], key)
    return paths


__all__ = ["FILES", "generate_certificates"]
