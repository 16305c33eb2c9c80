"""TLS certificates and SuperNode authentication keys, made offline with ``cryptography``.

``secfed flower certs DIR --host NAME --nodes N`` (or :func:`make_pki`) writes::

    DIR/ca.pem, ca.key              a self-signed CA (EC P-384, 10 years); ca.key stays offline
    DIR/server.pem, server.key      the SuperLink's certificate, signed by the CA, for the host
                                    names / IP addresses it is reached at (SAN), serverAuth
    DIR/node-I.key, node-I.pub      SuperNode I's authentication key pair (EC P-384, OpenSSH
                                    format): the SuperNode keeps node-I.key, the SuperLink operator
                                    registers node-I.pub (``flwr supernode register node-I.pub``)

SuperLink: ``--ssl-ca-certfile ca.pem --ssl-certfile server.pem --ssl-keyfile server.key
--enable-supernode-auth``; SuperNode I: ``--root-certificates ca.pem
--auth-supernode-private-key node-I.key``; ``flwr``: ``root-certificates = "ca.pem"`` in its
connection. Private keys are written 0600. The same files can be made with openssl (README).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secfed import atomic_file

VALID_DAYS = 3650


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    node_private: tuple[Path, ...]
    node_public: tuple[Path, ...]


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "secfed"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_pki(folder: Path, *, hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1"), nodes: int = 0) -> Pki:
    """CA, SuperLink certificate for ``hosts`` and ``nodes`` SuperNode key pairs in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = dict(not_valid_before=now - datetime.timedelta(minutes=5),
                 not_valid_after=now + datetime.timedelta(days=VALID_DAYS))

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("secfed CA")).issuer_name(_name("secfed CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA384()))

    server_key = ec.generate_private_key(ec.SECP384R1())
    server = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca.subject)
              .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
              .add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .sign(ca_key, hashes.SHA384()))

    atomic_file.write_bytes(folder / "ca.pem", ca.public_bytes(serialization.Encoding.PEM), mode=0o644)
    atomic_file.write_bytes(folder / "ca.key", _pem_key(ca_key))
    atomic_file.write_bytes(folder / "server.pem", server.public_bytes(serialization.Encoding.PEM), mode=0o644)
    atomic_file.write_bytes(folder / "server.key", _pem_key(server_key))
    private, public = [], []
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        private.append(atomic_file.write_bytes(folder / f"node-{i}.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())))
        public.append(atomic_file.write_bytes(folder / f"node-{i}.pub", key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH), mode=0o644))
    return Pki(folder / "ca.pem", folder / "server.pem", folder / "server.key", tuple(private), tuple(public))
