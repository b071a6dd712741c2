"""The page's parts that need no browser: logins and their CSRF check, escaping by construction,
and the cache map's counts from a receipt (the browser test compares them on the real model)."""

from __future__ import annotations

import pytest

from sinkd.daemon.http.ui.logins import IDLE_S, Logins, check_csrf
from sinkd.daemon.http.ui.markup import Html, html, table
from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import PermissionDenied, Unauthenticated


def test_a_login_is_a_random_cookie_with_its_own_csrf_token_and_ends_when_idle() -> None:
    now = [1000.0]
    logins = Logins(tls=False, clock=lambda: now[0])
    value, login = logins.open(Principal("alice"))
    other, _ = logins.open(Principal("alice"))
    assert value != other and login.csrf not in (value, other)
    assert logins.find(value).principal == Principal("alice")
    now[0] += IDLE_S + 1
    with pytest.raises(Unauthenticated):
        logins.find(value)
    with pytest.raises(Unauthenticated):
        logins.find(None)
    logins.close(other)
    with pytest.raises(Unauthenticated):
        logins.find(other)


def test_the_cookie_is_httponly_strict_and_over_tls_secure_and_host_only() -> None:
    plain = Logins(tls=False).cookie_header("v")
    assert "HttpOnly" in plain and "SameSite=Strict" in plain and "Secure" not in plain
    tls = Logins(tls=True)
    assert tls.cookie == "__Host-sinkd_ui"
    header = tls.cookie_header("v")
    assert header.startswith("__Host-sinkd_ui=v; Path=/;") and "; Secure" in header
    assert "Domain" not in header


def test_a_form_needs_the_login_s_csrf_token_and_this_origin() -> None:
    _, login = Logins(tls=False).open(Principal("alice"))
    own = "http://127.0.0.1:8080"
    check_csrf(login, login.csrf, None, own)
    check_csrf(login, login.csrf, own, own)
    for sent, origin in (
        (None, own),
        ("", own),
        ("x" + login.csrf, own),
        (login.csrf, "http://evil"),
    ):
        with pytest.raises(PermissionDenied):
            check_csrf(login, sent, origin, own)


def test_text_is_escaped_unless_this_package_made_it_markup() -> None:
    evil = '<script>alert("x")</script>'
    assert html("<td>{}</td>", evil) == "<td>&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;</td>"
    assert html("<td>{}</td>", Html("<b>ok</b>")) == "<td><b>ok</b></td>"
    assert "<script>" not in table(["a"], [[evil]]) and "&lt;script&gt;" in table(["a"], [[evil]])
    assert html('<a href="{}">x</a>', '" onclick="x') == '<a href="&quot; onclick=&quot;x">x</a>'
