"""One client identity (nearsight/app/serve/clients.py): the socket's address unless a named
proxy forwards it, and access-log fields that cannot forge a line or a field."""

from __future__ import annotations

import pytest

from nearsight.app.serve.clients import TrustedProxies, identify, log_field
from nearsight.core.errors import NearsightError


def _scope(peer: str, *headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http", "client": (peer, 5555), "headers": list(headers)}


FORGED = (b"x-forwarded-for", b"203.0.113.9")


def test_a_client_is_its_socket_unless_the_proxy_is_named():
    assert identify(_scope("127.0.0.1", FORGED), TrustedProxies("")) == ("127.0.0.1", None)
    assert identify(_scope("10.0.0.7", FORGED), TrustedProxies("10.0.0.5")) == ("10.0.0.7", None)
    proxy = TrustedProxies("10.0.0.0/24")
    https = (b"x-forwarded-proto", b"https")
    assert identify(_scope("10.0.0.5", FORGED, https), proxy) == ("203.0.113.9", "https")


def test_the_rightmost_untrusted_address_counts_and_junk_stops_the_chain():
    proxy = TrustedProxies("10.0.0.5, 10.0.0.6")
    chain = (b"x-forwarded-for", b"198.51.100.1, 203.0.113.9, 10.0.0.6")
    assert identify(_scope("10.0.0.5", chain), proxy)[0] == "203.0.113.9"  # not the forged first
    junk = (b"x-forwarded-for", b"203.0.113.9, evil\nname")
    assert identify(_scope("10.0.0.5", junk), proxy)[0] == "10.0.0.5"
    assert identify(_scope("10.0.0.5", (b"x-forwarded-proto", b"gopher")), proxy)[1] is None


def test_a_proxy_that_is_not_an_address_is_one_line():
    with pytest.raises(NearsightError, match="--forwarded-allow-ips: 'proxy.local'"):
        TrustedProxies("proxy.local")


def test_log_fields_escape_what_could_forge_a_line_or_a_field():
    assert log_field('GET /a b"c\\d\n\x1b[31m') == 'GET\\x20/a\\x20b\\"c\\\\d\\n\\x1b[31m'
    assert log_field("") == "-"
    assert log_field("x" * 300) == "x" * 200 + "..."
    assert " " not in log_field("a b\u2028c") and "\n" not in log_field("a\u2028b")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--forwarded-allow-ips", "proxy.local"], "--forwarded-allow-ips: 'proxy.local'"),
        (["--max-unauthenticated", "0"], "--max-unauthenticated must be at least 1"),
        (["--sign-in-timeout", "0"], "--sign-in-timeout must be positive"),
    ],
)
def test_serve_checks_the_new_flags_first(flags, message, tmp_path, capsys):
    from helpers import assert_one_line_error, run

    code, _, err = run(capsys, "serve", "--gallery", tmp_path / "missing", *flags)
    assert_one_line_error(code, err, message)
