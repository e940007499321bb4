"""Who may look and who may act.

* Binding: loopback by default; any other address needs a token (``check_bind``).
* Host: a dashboard bound to loopback answers only requests whose ``Host`` is a loopback
  name (``localhost``, ``127.0.0.1``, ``[::1]``, any port) or one given with
  ``--allowed-host``; anything else is 400. That stops DNS rebinding: a page on
  ``attacker.example`` that re-points its name at 127.0.0.1 gets nowhere, since its
  requests say ``Host: attacker.example``. Bound beyond loopback (which needs a token),
  every ``Host`` is served unless ``--allowed-host`` names the ones to serve.
* Token (when set): every page, API call and ``/metrics`` needs it, as
  ``Authorization: Bearer <token>`` (scripts, Prometheus) or as the session cookie that
  ``/login`` sets after checking it (browsers). Compared with ``hmac.compare_digest``.
* CSRF: a POST authenticated by a cookie (or not at all, on a loopback dashboard without a
  token) must carry the CSRF token, as the form field ``csrf_token`` or the header
  ``X-CSRF-Token``, equal to the ``qw_csrf`` cookie (double submit; the cookie value is
  signed with a per-process secret so it cannot be planted). A POST whose ``Origin`` is
  another site is refused outright. A POST with a valid bearer token needs no CSRF token:
  browsers never attach that header on their own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets

from starlette.requests import Request

CSRF_COOKIE = "qw_csrf"
SESSION_COOKIE = "qw_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


class BindRefused(ValueError):
    pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def request_host(header: str) -> str:
    """The host name of a ``Host`` header, without its port, lower-case."""
    value = header.strip().lower()
    if value.startswith("["):  # [::1]:9181
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def host_allowed(header: str, bind: str, allowed: tuple[str, ...]) -> bool:
    """May a request with this ``Host`` header be served (see the module docstring)?"""
    host = request_host(header)
    if not host:
        return False
    if host in allowed or is_loopback(host):
        return True
    return not is_loopback(bind) and not allowed


def local_path(target: str) -> str:
    """``target`` if it is a path on this dashboard, else ``/``: where a login or a form
    post may send the browser next. Not ``//host`` nor ``/\\host`` (browsers read both as
    another site), nor one with an ASCII control character (browsers drop tabs and line
    breaks from addresses: ``/<tab>/host`` would become ``//host``)."""
    if (
        target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and not any(ord(c) < 32 or ord(c) == 127 for c in target)
    ):
        return target
    return "/"


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve beyond loopback without a token."""
    if not is_loopback(host) and not token:
        raise BindRefused(
            f"refusing to bind the dashboard to {host!r} without a token: anyone who can reach "
            "it could cancel tasks and drain workers. Set --token (or "
            "QUEUEWORKS_DASHBOARD_TOKEN), or bind to 127.0.0.1."
        )


class Guard:
    def __init__(self, token: str | None, secret: bytes | None = None) -> None:
        self.token = token or None
        self._secret = secret or secrets.token_bytes(32)

    def _sign(self, what: str) -> str:
        return hmac.new(self._secret, what.encode(), hashlib.sha256).hexdigest()

    # -- authentication -------------------------------------------------------------------

    def token_ok(self, candidate: str | None) -> bool:
        if self.token is None or not candidate:
            return False
        return hmac.compare_digest(candidate.encode(), self.token.encode())

    def bearer_ok(self, request: Request) -> bool:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_ok(value.strip())

    def session_value(self) -> str:
        assert self.token is not None
        return self._sign("session:" + hashlib.sha256(self.token.encode()).hexdigest())

    def session_ok(self, request: Request) -> bool:
        cookie = request.cookies.get(SESSION_COOKIE)
        if self.token is None or not cookie:
            return False
        return hmac.compare_digest(cookie.encode(), self.session_value().encode())

    def authenticated(self, request: Request) -> bool:
        return self.token is None or self.bearer_ok(request) or self.session_ok(request)

    # -- CSRF -----------------------------------------------------------------------------

    def new_csrf(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign('csrf:' + nonce)[:32]}"

    def csrf_valid(self, value: str | None) -> bool:
        if not value or "." not in value:
            return False
        nonce, sig = value.split(".", 1)
        return hmac.compare_digest(sig.encode(), self._sign("csrf:" + nonce)[:32].encode())

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        cookie = request.cookies.get(CSRF_COOKIE)
        if not self.csrf_valid(cookie) or not submitted:
            return False
        assert cookie is not None
        return hmac.compare_digest(cookie.encode(), submitted.encode())


def same_origin(request: Request) -> bool:
    """False only when the browser says the request comes from another origin."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host
