"""Who is logged in to the page: a random cookie per login, kept in memory, with its own CSRF
token; the tenant's token is checked once, at login, and never travels again (never in a URL).

The cookie is HttpOnly and SameSite=Strict, and Secure with the `__Host-` prefix where the front
serves TLS. Every state-changing form carries the login's CSRF token and, where the browser says
where it came from (`Origin`), must come from this page's origin. A restart logs everyone out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sinkd.daemon.runtime.sessions import Principal
from sinkd.errors import PermissionDenied, Unauthenticated

MAX_LOGINS = 1024  # the oldest is logged out past it
IDLE_S = 12 * 3600


@dataclass
class Login:
    principal: Principal
    csrf: str
    seen: float


class Logins:
    def __init__(self, tls: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.tls = tls
        self.cookie = "__Host-sinkd_ui" if tls else "sinkd_ui"
        self._clock = clock
        self._lock = threading.Lock()
        self._by_digest: OrderedDict[str, Login] = OrderedDict()

    def open(self, principal: Principal) -> tuple[str, Login]:
        """A new login: its cookie value (kept here only as a digest) and its record."""
        value = secrets.token_urlsafe(32)
        login = Login(principal, secrets.token_urlsafe(32), self._clock())
        with self._lock:
            self._by_digest[_digest(value)] = login
            while len(self._by_digest) > MAX_LOGINS:
                self._by_digest.popitem(last=False)
        return value, login

    def find(self, value: str | None) -> Login:
        """The login of a cookie (Unauthenticated: none, ended, or idle past IDLE_S)."""
        if not value:
            raise Unauthenticated("not logged in")
        key = _digest(value)
        now = self._clock()
        with self._lock:
            login = self._by_digest.get(key)
            if login is None or now - login.seen > IDLE_S:
                self._by_digest.pop(key, None)
                raise Unauthenticated("not logged in, or the login has ended")
            login.seen = now
            self._by_digest.move_to_end(key)
        return login

    def close(self, value: str | None) -> None:
        if value:
            with self._lock:
                self._by_digest.pop(_digest(value), None)

    def cookie_header(self, value: str, max_age: int = IDLE_S) -> str:
        secure = "; Secure" if self.tls else ""
        return (
            f"{self.cookie}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"
        )


def check_csrf(login: Login, sent: str | None, origin: str | None, own_origin: str) -> None:
    """A state-changing form: its CSRF token is the login's, and it came from this origin."""
    if origin is not None and origin != own_origin:
        raise PermissionDenied("this form did not come from sinkd's own page")
    if not sent or not hmac.compare_digest(sent.encode(), login.csrf.encode()):
        raise PermissionDenied("the form's CSRF token is missing or wrong: reload the page")


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()
