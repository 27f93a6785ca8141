"""Who may see the status page: one-time login links, sessions and CSRF tokens.

The operator capability never reaches the browser. ``afterword continuations ui`` spends it
once, over the operator API, to have the service mint a *login token*: random, valid for
``LOGIN_TTL_MS`` and for one use. Following the link trades it for a *session* (a random id
in an HttpOnly, SameSite=Strict cookie) that expires ``SESSION_TTL_MS`` after login, and each
session carries its own CSRF token for the forms that change state.

Everything is in memory: a restart logs every browser out, which is the safe direction.
Time comes from the service's clock, so tests can move it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

LOGIN_TTL_MS = 60_000
SESSION_TTL_MS = 8 * 60 * 60 * 1000
MAX_PENDING_LOGINS = 64
MAX_SESSIONS = 64
COOKIE = "afterword_ui"  # the prefix; each state directory adds its own tag (cookie_name)


def cookie_name(key: bytes) -> str:
    """The session cookie's name for one state directory, from its status-page key.

    Browsers keep one cookie jar per host name, whatever the port, so two services on
    ``127.0.0.1`` sharing one name would overwrite each other's session at every sign-in. A
    tag derived from the state secret gives each its own cookie, and the same one across
    restarts (so a new sign-in replaces the last rather than piling up). The tag is an HMAC
    output, not the key: it reveals nothing that mints or checks anything.
    """
    return f"{COOKIE}_{hmac.new(key, b'session-cookie-name', hashlib.sha256).hexdigest()[:16]}"


@dataclass(frozen=True)
class Session:
    expires_at_ms: int
    csrf: str


class UiAuth:
    """Login tokens and sessions of one running service (bounded: the oldest go first)."""

    def __init__(
        self,
        clock_ms: Callable[[], int],
        *,
        token: Callable[[], str] = lambda: secrets.token_urlsafe(32),
        login_ttl_ms: int = LOGIN_TTL_MS,
        session_ttl_ms: int = SESSION_TTL_MS,
        cookie: str = COOKIE,
    ) -> None:
        self._clock = clock_ms
        self.cookie = cookie
        self._token = token
        self.login_ttl_ms = login_ttl_ms
        self.session_ttl_ms = session_ttl_ms
        self._logins: dict[str, int] = {}  # login token -> expiry
        self._sessions: dict[str, Session] = {}

    def __repr__(self) -> str:  # never the tokens themselves
        return f"<UiAuth logins={len(self._logins)} sessions={len(self._sessions)}>"

    def _prune(self, now: int) -> None:
        self._logins = {t: exp for t, exp in self._logins.items() if exp > now}
        self._sessions = {s: v for s, v in self._sessions.items() if v.expires_at_ms > now}

    def mint_login(self) -> tuple[str, int]:
        """A new one-time login token and the moment it stops being accepted."""
        now = self._clock()
        self._prune(now)
        while len(self._logins) >= MAX_PENDING_LOGINS:
            del self._logins[next(iter(self._logins))]
        token = self._token()
        expires = now + self.login_ttl_ms
        self._logins[token] = expires
        return token, expires

    def redeem(self, token: str) -> tuple[str, Session] | None:
        """Spend a login token: a new session (id, session), or None when the token is
        unknown, already used or expired. A token is gone after its first use, valid or not."""
        now = self._clock()
        expires = self._logins.pop(token, None) if token else None
        if expires is None or expires <= now:
            return None
        self._prune(now)
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        sid = self._token()
        session = Session(expires_at_ms=now + self.session_ttl_ms, csrf=self._token())
        self._sessions[sid] = session
        return sid, session

    def session(self, sid: str | None) -> Session | None:
        """The live session for a cookie value, or None (unknown or expired)."""
        if not sid:
            return None
        found = self._sessions.get(sid)
        if found is None:
            return None
        if found.expires_at_ms <= self._clock():
            del self._sessions[sid]
            return None
        return found

    def end(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)

    @staticmethod
    def csrf_ok(session: Session, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(session.csrf.encode(), (sent or "").encode())
