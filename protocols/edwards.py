"""Whether a raw Ed25519 public key can stand for one identity: canonical, on the curve, not of small order.

``cryptography`` (OpenSSL) verifies signatures under any 32 bytes that decode, and exposes no point
arithmetic; two byte strings can then be one point (a non-canonical y ≥ p), and under a point of small
order a signature anyone can forge verifies (found by review: the neutral point, written 01 00…00 and
ee ff…ff 7f, passed as two distinct identities). So this module decodes the point as RFC 8032 §5.1.3
says and multiplies it by the cofactor 8 (three doublings, §5.1.4's formulas in extended coordinates):
plain integer arithmetic on public values, no secret involved — a check, not a cryptographic primitive.
"""

from __future__ import annotations

from functools import lru_cache

_P = 2**255 - 19
_D = -121665 * pow(121666, -1, _P) % _P
_SQRT_MINUS_ONE = pow(2, (_P - 1) // 4, _P)


@lru_cache(maxsize=1 << 16)  # ≈ 0.1 ms a key; a deployment's cohort is checked every session
def weak_identity_key(key: bytes) -> str | None:
    """Why ``key`` cannot stand for one identity (not 32 bytes, a non-canonical encoding, no point on
    the curve, a point of small order), or None for a key that can."""
    if len(key) != 32:
        return f"{len(key)} bytes, not 32"
    y, sign = int.from_bytes(key, "little") & ((1 << 255) - 1), key[31] >> 7
    if y >= _P:
        return "a non-canonical encoding (y ≥ p: another key's point written twice)"
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x = u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P) % _P
    if (v * x * x - u) % _P:
        x = x * _SQRT_MINUS_ONE % _P
        if (v * x * x - u) % _P:
            return "not a point of the curve"
    if x == 0 and sign:
        return "a non-canonical encoding (x = 0 with the sign bit set)"
    if x % 2 != sign:
        x = _P - x
    point = (x, y, 1, x * y % _P)
    for _ in range(3):
        point = _double(*point)
    X, Y, Z, _ = point
    if X % _P == 0 and (Y - Z) % _P == 0:  # [8]P is the neutral point: P's order divides 8
        return "a point of small order (signatures anyone can make verify under it)"
    return None


def _double(x: int, y: int, z: int, t: int) -> tuple[int, int, int, int]:
    a, b, c = x * x % _P, y * y % _P, 2 * z * z % _P
    h = (a + b) % _P
    e = (h - (x + y) * (x + y)) % _P
    g, f = (a - b) % _P, (c + a - b) % _P
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P
