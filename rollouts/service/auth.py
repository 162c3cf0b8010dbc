"""Bearer tokens: made here, shown once, stored only as a hash.

A token is `rlt_` + 43 URL-safe characters (256 random bits). The database keeps its SHA-256
(a slow password hash adds nothing for a secret of that entropy), so a copy of the database
does not let anyone call the API. Lookups compare hashes; the token itself is never logged,
stored or returned after creation.
"""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["TOKEN_PREFIX", "bearer_token", "hash_token", "new_token"]

TOKEN_PREFIX = "rlt_"


def new_token() -> str:
    """A fresh random token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """What the database stores for `token`."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None (any other shape)."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value.startswith(TOKEN_PREFIX) or len(value) > 200:
        return None
    return value
