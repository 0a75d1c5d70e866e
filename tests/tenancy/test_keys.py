"""Key format, hashing and verification (pure functions)."""

from __future__ import annotations

from tenancy import generate_key, hash_key, key_prefix, verify_key


def test_generated_key_shape_and_entropy():
    generated = generate_key()
    assert generated.key.startswith(generated.prefix + "_")
    assert generated.prefix.startswith("fl-") and len(generated.prefix) == 11
    secret = generated.key[len(generated.prefix) + 1 :]
    assert len(secret) >= 43  # token_urlsafe(32): 256 bits in 43 base64url characters
    assert generated.secret_hash == hash_key(generated.key) and len(generated.secret_hash) == 64
    assert generated.key not in generated.secret_hash


def test_keys_are_unique():
    keys = {generate_key().key for _ in range(200)}
    assert len(keys) == 200


def test_verify_accepts_only_the_exact_key():
    generated = generate_key()
    assert verify_key(generated.key, generated.secret_hash)
    assert not verify_key(generated.key + "x", generated.secret_hash)
    assert not verify_key(generated.key[:-1], generated.secret_hash)
    assert not verify_key(generate_key().key, generated.secret_hash)


def test_key_prefix_parses_ours_and_rejects_others():
    generated = generate_key()
    assert key_prefix(generated.key) == generated.prefix
    for bad in ("", "sk-abc", "fl-", "fl-short_x", "fl-abcdefgh", "fl-abcdefgh-", "fl-abc$efgh_secret"):
        assert key_prefix(bad) is None, bad
