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
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import idna
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secfed import atomic_file, locking

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


# Labels of letters, digits, hyphens inside and underscores (container names use them); a wildcard only
# over two labels or more; the last label not a number (127.1 and 0x7f000001 are addresses no resolver
# reads as names: found by review)
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_NAME = re.compile(rf"(?:\*\.(?={_LABEL}\.{_LABEL}))?(?:{_LABEL}\.)*{_LABEL}", re.ASCII)
_NUMBER = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*", re.ASCII)


def _alt_name(host: str) -> x509.GeneralName:
    """An IP address, or a DNS name (an internationalised one as its A-label); ValueError naming a host
    that is neither (found by review: "", "a b" and "ünï.example" were a traceback or a certificate no
    client would match)."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:  # a trailing dot (the root) is dropped: clients match the name without it (found by review)
        name = host.removesuffix(".").encode("idna").decode("ascii")
    except UnicodeError:
        name = ""
    if name and not host.isascii():  # IDNA 2003 (Python's codec, ssl) and 2008 (browsers, idna) differ on ß,
        try:                         # ς and the joiners: faß.de is fass.de to one, xn--fa-hia.de to the other
            strict = idna.encode(host.removesuffix("."), uts46=True).decode("ascii")
        except idna.IDNAError:
            strict = name
        if strict != name:
            raise ValueError(f"{host!r} is {name} under IDNA 2003 and {strict} under IDNA 2008, and clients differ "
                             "in which they use: give the one they connect to (its ASCII form)")
    if not _DNS_NAME.fullmatch(name) or len(name) > 253 or _NUMBER.fullmatch(name.rsplit(".", 1)[-1]):
        raise ValueError(f"{host!r} is neither an IP address nor a host name")
    return x509.DNSName(name)


def make_pki(folder: Path, *, hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1"), nodes: int = 0,
             replace: bool = False) -> Pki:
    """CA, SuperLink certificate for ``hosts`` and ``nodes`` SuperNode key pairs in ``folder``. Files
    already there are refused (FileExistsError naming them) unless ``replace``: a CA's private key
    replaced is every certificate it signed lost (found by review)."""
    folder = Path(folder)
    names = [_alt_name(h) for h in hosts]  # every host checked before anything is written
    if not names:
        raise ValueError("at least one host the SuperLink is reached at")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    ours = ["ca.pem", "ca.key", "server.pem", "server.key",
            *(f"node-{i}.{e}" for i in range(nodes) for e in ("key", "pub"))]
    with locking.exclusive(folder / ".pki.lock", wait=60):  # two commands at once: the second sees the first's files
        if not replace and (there := [n for n in ours if os.path.lexists(folder / n)]):
            raise FileExistsError(f"{folder} already holds {', '.join(there)}: give a new folder "
                                  "(nothing was replaced)")
        return _write_pki(folder, names, nodes)


def _write_pki(folder: Path, names: list[x509.GeneralName], nodes: int) -> Pki:
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
    # the subject is a fixed name: the SAN holds the hosts (a long first host overflowed the CN: review)
    server = (x509.CertificateBuilder().subject_name(_name("secfed SuperLink")).issuer_name(ca.subject)
              .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
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
