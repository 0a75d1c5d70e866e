"""API key format, hashing and constant-time verification.

A key reads ``fl-AbCd1234_<secret>``: ``fl-AbCd1234`` is the public prefix (stored, shown, used
for lookup) and the secret is ``secrets.token_urlsafe(32)`` (256 bits). With that much entropy a
fast hash cannot be brute-forced, so we store sha256 of the whole key and nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass

KEY_MARK = "fl-"
PREFIX_CHARS = 8
SECRET_BYTES = 32  # 256 bits
_ALPHABET = string.ascii_letters + string.digits
PREFIX_LEN = len(KEY_MARK) + PREFIX_CHARS


@dataclass(frozen=True)
class GeneratedKey:
    """A fresh key: ``key`` is shown to its owner once; only ``prefix`` and ``secret_hash`` are stored."""

    key: str
    prefix: str
    secret_hash: str


def hash_key(key: str) -> str:
    """sha256 hex of the whole presented key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def generate_key() -> GeneratedKey:
    prefix = KEY_MARK + "".join(secrets.choice(_ALPHABET) for _ in range(PREFIX_CHARS))
    key = f"{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}"
    return GeneratedKey(key=key, prefix=prefix, secret_hash=hash_key(key))


def key_prefix(key: str) -> str | None:
    """The public prefix of a well-formed key, or None if ``key`` cannot be one of ours."""
    if not key.startswith(KEY_MARK) or len(key) < PREFIX_LEN + 2 or key[PREFIX_LEN] != "_":
        return None
    prefix = key[:PREFIX_LEN]
    if not all(c in _ALPHABET for c in prefix[len(KEY_MARK) :]):
        return None
    return prefix


def verify_key(key: str, secret_hash: str) -> bool:
    """Constant-time comparison of the presented key's hash with the stored one."""
    return hmac.compare_digest(hash_key(key), secret_hash)
