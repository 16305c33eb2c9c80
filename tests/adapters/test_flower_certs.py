"""`secfed flower certs`: a CA, the SuperLink's certificate and SuperNode keys — never over existing ones."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from cryptography import x509

from secfed.cli.main import cli


def certs(*args: str):
    return CliRunner().invoke(cli, ["flower", "certs", *args], env={"COLUMNS": "250"})


def test_certs_never_replace_a_ca_and_name_a_host_no_certificate_can_hold(tmp_path: Path) -> None:
    """(review: a second `flower certs` into the same folder silently replaced ca.key — every certificate
    it had signed lost; --host "" or "ünï.example" and a folder under /proc were tracebacks; "a b" was
    accepted as a DNS name)"""
    pki = tmp_path / "pki"
    assert certs(str(pki), "--nodes", "1").exit_code == 0
    ca_key = (pki / "ca.key").read_bytes()
    again = certs(str(pki), "--nodes", "1")
    assert again.exit_code == 2 and "already holds ca.pem, ca.key" in again.output
    assert (pki / "ca.key").read_bytes() == ca_key
    # (review of the fix: a CN of a 74-character host raised; "*.com", "127.1", "0x7f000001" and "-a-.example"
    # made certificates no client matches; a trailing dot too)
    # (review: "faß.de" became fass.de, while IDNA 2008 clients look for xn--fa-hia.de)
    for host in ("", "a b", "x..y", "*.com", "127.1", "0x7f000001", "-a-.example", "faß.de"):
        result = certs(str(tmp_path / "bad"), "--host", host)
        assert result.exit_code == 2 and "--host" in result.output, host
        assert ("neither an IP" if host.isascii() else "xn--fa-hia.de") in result.output, host
    assert not (tmp_path / "bad").exists()
    long = ".".join(["label"] * 12) + ".example"  # 79 characters
    assert certs(str(tmp_path / "idn"), "--host", "ünï.example", "--host", "10.0.0.1", "--host", "sl.example.",
                 "--host", long, "--host", "secfed_superlink").exit_code == 0
    server = x509.load_pem_x509_certificate((tmp_path / "idn" / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["xn--n-nga1b.example", "sl.example", long, "secfed_superlink"]
    result = certs("/proc/secfed-certs")
    assert result.exit_code == 2 and "cannot write there" in result.output


def test_a_superlink_certificate_that_does_not_verify_is_named_before_the_run_starts(tmp_path: Path) -> None:
    """(review: another CA, an expired certificate or one for another host all ended in flwr's "Connection
    to the SuperLink is unavailable"; the cause was only in the SuperLink's log)"""
    import socket
    import ssl
    import threading

    import click
    import pytest

    from secfed.adapters.flower.certs import make_pki
    from secfed.cli.flower import Connection, check_reachable

    ours, theirs = make_pki(tmp_path / "ours", hosts=("127.0.0.1",)), make_pki(tmp_path / "theirs")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(ours.server_cert, ours.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                server.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        check_reachable(Connection(f"127.0.0.1:{port}", ours.ca_cert, None))  # the right CA: passes
        (tmp_path / "garbage.pem").write_text("not a certificate")
        for ca, said in ((theirs.ca_cert, "does not verify"), (tmp_path / "garbage.pem", "holds no CA certificate")):
            with pytest.raises(click.ClickException, match=said):
                check_reachable(Connection(f"127.0.0.1:{port}", ca, None))
        with pytest.raises(click.ClickException, match="does not verify: .*(mismatch|match)"):
            check_reachable(Connection(f"localhost:{port}", ours.ca_cert, None))  # made for 127.0.0.1 alone
        with pytest.raises(click.ClickException, match="speaks TLS, and the connection file says insecure"):
            check_reachable(Connection(f"127.0.0.1:{port}", None, None))  # insecure = true against TLS
    finally:
        listener.close()
