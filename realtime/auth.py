"""Who may open a session: API keys, short-lived single-use session tokens, Origin allow-list.

Off by default (the local demo needs nothing). With an API key configured:

* server-to-server clients present the key: ``Authorization: Bearer <key>`` or ``X-API-Key``;
* a browser cannot set headers on a WebSocket, so its backend (holding the key) mints a session
  token at ``POST /v1/session-tokens`` and hands it to the page. The token is
  ``b64url(payload).b64url(HMAC-SHA256(secret, payload))`` with payload ``{"exp", "jti"}``: it
  expires after at most 5 minutes and is accepted once (its ``jti`` is remembered until it
  expires). The WebSocket takes it as ``?token=`` or as a ``voicewire.token.<token>`` subprotocol;
  ``POST /offer`` as ``?token=``, a ``token`` body field or the bearer header.

With an Origin allow-list, a request that carries an ``Origin`` header must match one entry
exactly (scheme, host and port): no suffix or wildcard matching. Requests without ``Origin``
(non-browser clients) are not origin-checked but still need credentials when auth is on.
Every check runs before anything is allocated for the request.

A session token is spent when a request to an endpoint that takes one presents it, whatever that
request is answered: a token seen on a request refused for capacity, readiness or its body cannot
be replayed. Only a refusal for the Origin leaves it unspent (it comes first, and tells a foreign
page nothing more).

Credentials in a URL are recognized in one place, here, on the decoded query (``?%74oken=`` is
``token``, as aiohttp reads it): ``token_from_request`` takes them from it and ``masked_path_qs``
masks them in log lines, whatever their spelling.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from yarl import URL

MAX_TOKEN_TTL_S = 300.0
# The session tokens' HMAC key, hex: gateway processes that share it accept each other's tokens
# (serve --workers gives its workers one, this one where set; gateways of several hosts may share one).
TOKEN_SECRET_ENV = "VOICEWIRE_TOKEN_SECRET"
TOKEN_SUBPROTOCOL_PREFIX = "voicewire.token."
# Query parameters whose values are credentials. Only ``token`` is read; the others are names
# clients try for a key, masked all the same. Matched case-insensitively, after decoding.
CREDENTIAL_PARAMS = frozenset({"token", "key", "api_key", "apikey", "access_token"})
MASK = "***"


class AuthError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class AuthConfig:
    api_keys: tuple[str, ...] = ()  # empty: auth off
    allowed_origins: tuple[str, ...] = ()  # empty: any origin
    token_ttl_s: float = 120.0
    secret: bytes = b""  # HMAC key for session tokens; random per process when empty
    # Where spent tokens are marked, one file each, shared by the gateway processes of one port
    # (serve --workers: a token minted by one is redeemed by any, once); None: this process's memory.
    spent_dir: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.token_ttl_s <= MAX_TOKEN_TTL_S:
            raise ValueError(f"token_ttl_s must be within (0, {MAX_TOKEN_TTL_S}]")
        if any("." in k or len(k) < 16 for k in self.api_keys):
            # Bearer values with a dot are session tokens; keys are told apart by having none.
            raise ValueError("API keys must be at least 16 characters and contain no '.'")

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys)


def token_secret(environ: Mapping[str, str]) -> bytes:
    """The HMAC key ``TOKEN_SECRET_ENV`` sets (b"": a random one per process); ValueError if unusable."""
    value = environ.get(TOKEN_SECRET_ENV, "")
    try:
        secret = bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"{TOKEN_SECRET_ENV} must be hex digits") from None
    if value and len(secret) < 32:
        raise ValueError(f"{TOKEN_SECRET_ENV} must hold at least 32 bytes (64 hex digits)")
    return secret


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Authenticator:
    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._secret = config.secret or secrets.token_bytes(32)
        self._clock = clock
        self._used: dict[str, float] = {}  # jti -> exp, pruned as tokens expire

    def _now(self) -> float:
        return self._clock()

    # --- tokens ------------------------------------------------------------------------------
    def mint(self, ttl_s: float | None = None) -> tuple[str, float]:
        ttl = min(ttl_s or self.config.token_ttl_s, MAX_TOKEN_TTL_S)
        exp = self._now() + ttl
        payload = json.dumps(
            {"exp": round(exp, 3), "jti": secrets.token_hex(12)}, separators=(",", ":")
        ).encode()
        sig = hmac.new(self._secret, payload, hashlib.sha256).digest()
        return f"{_b64(payload)}.{_b64(sig)}", exp

    def redeem(self, token: str) -> None:
        """Accept a session token once. Raises AuthError (401) for a bad, expired or reused token."""
        try:
            head, sig = token.split(".")
            payload = _unb64(head)  # non-ASCII text raises ValueError here, like any bad base64
            good = hmac.compare_digest(_unb64(sig), hmac.new(self._secret, payload, hashlib.sha256).digest())
            claims = json.loads(payload) if good else None
            exp, jti = float(claims["exp"]), str(claims["jti"])  # type: ignore[index]
            if not (jti.isascii() and jti.isalnum()):  # it names a file in spent_dir
                raise ValueError(jti)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            raise AuthError(
                401, "invalid_token", "the session token is malformed or its signature is wrong"
            ) from None
        now = self._now()
        self._prune(now)
        if exp <= now:
            raise AuthError(401, "expired_token", "the session token has expired; mint a new one")
        if jti in self._used or not self._claim(jti, exp, now):
            raise AuthError(401, "token_reused", "session tokens are single-use")
        self._used[jti] = exp

    def _claim(self, jti: str, exp: float, now: float) -> bool:
        """Spend ``jti`` where every gateway process of the port sees it: False if one did before."""
        if self.config.spent_dir is None:
            return True
        spent = Path(self.config.spent_dir)
        if len(self._used) % 64 == 0:  # now and then: the files of expired tokens
            for old in spent.iterdir():
                with contextlib.suppress(ValueError, OSError):
                    if float(old.name.split("-")[0]) <= now:
                        old.unlink()
        try:  # created or found at once, whichever process comes first
            os.close(os.open(spent / f"{exp:.3f}-{jti}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return False
        return True

    def _prune(self, now: float) -> None:
        if len(self._used) > 1024:
            self._used = {j: e for j, e in self._used.items() if e > now}

    # --- requests ------------------------------------------------------------------------------
    def check_origin(self, origin: str | None) -> None:
        allowed = self.config.allowed_origins
        if allowed and origin is not None and origin not in allowed:
            raise AuthError(403, "origin_not_allowed", f"origin {origin[:100]!r} is not allowed")

    def check_api_key(self, key: str | None) -> None:
        if key is None:
            raise AuthError(401, "missing_credentials", "an API key is required")
        # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not a "no").
        given = key.encode("utf-8", "surrogateescape")
        if not any(hmac.compare_digest(given, k.encode()) for k in self.config.api_keys):
            raise AuthError(401, "invalid_api_key", "the API key is not valid")

    def authorize(self, *, api_key: str | None, token: str | None) -> None:
        """Credentials of a request that spends engine time: an API key or a session token."""
        if not self.config.enabled:
            return
        if token is not None:
            self.redeem(token)
        elif api_key is not None:
            self.check_api_key(api_key)
        else:
            raise AuthError(401, "missing_credentials", "a session token or an API key is required")


def api_key_from_headers(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization")
    if auth and auth.startswith("Bearer ") and "." not in auth[7:]:
        return auth[7:].strip()
    return headers.get("X-API-Key") or None


def _is_credential(param: str) -> bool:
    return param.strip().lower() in CREDENTIAL_PARAMS


def masked_path_qs(url: URL) -> str:
    """A request's path and query for a log line, every credential's value replaced by ``***``.

    The query is the decoded one aiohttp hands handlers, re-encoded with the values replaced: a
    pattern over the raw text would miss ``?%74oken=``, which aiohttp reads as ``token``."""
    query = url.query
    if not any(_is_credential(param) for param in query):
        return url.raw_path_qs
    masked = [(param, MASK if _is_credential(param) else value) for param, value in query.items()]
    return url.with_query(masked).raw_path_qs


def token_from_request(query: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    """A session token from ``?token=``, a ``voicewire.token.*`` subprotocol or a bearer header."""
    token = query.get("token")
    if token:
        return token
    for proto in (p.strip() for p in headers.get("Sec-WebSocket-Protocol", "").split(",")):
        if proto.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return proto[len(TOKEN_SUBPROTOCOL_PREFIX) :]
    auth = headers.get("Authorization")
    if auth and auth.startswith("Bearer ") and "." in auth[7:]:
        return auth[7:].strip()  # tokens contain a dot; API keys are told apart by having none
    return None
