"""Who is calling: bearer tokens checked by their sha256, or the socket's own user when no tenants."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from sinkd.daemon.config import Settings
from sinkd.daemon.runtime.sessions import LOCAL_TENANT, Principal
from sinkd.errors import Unauthenticated


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        self._tenants = {t.token_sha256: t.name for t in settings.tenants}
        self._admin = settings.admin_token_sha256
        self.open = not settings.tenants  # Unix socket only (enforced by the settings)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal:
        token = None
        for key, value in metadata:
            if key.lower() == "authorization" and isinstance(value, str):
                scheme, _, rest = value.partition(" ")
                if scheme.lower() == "bearer" and rest.strip():
                    token = rest.strip()
        if token is None:
            if self.open:
                return Principal(LOCAL_TENANT, admin=self._admin is None)
            raise Unauthenticated(
                "missing bearer token: send metadata 'authorization: Bearer <token>'"
            )
        digest = hashlib.sha256(token.encode()).hexdigest()
        if self._admin is not None and hmac.compare_digest(digest, self._admin):
            return Principal(None, admin=True)
        for known, name in self._tenants.items():
            if hmac.compare_digest(digest, known):
                return Principal(name)
        if self.open:
            raise Unauthenticated(
                "this daemon has no tenants; connect over its Unix socket without a token"
            )
        raise Unauthenticated("unknown bearer token")
