"""Argument checks shared by the stores (TypeError for the wrong type, ValueError for
a wrong value)."""

from __future__ import annotations

import math

#: The largest token a store accepts: tokens are stored as SQL BIGINT and as decimal
#: strings in Redis, 0 <= token < 2**63. (redlock issues tokens below 2**53.)
MAX_STORED_TOKEN = 2**63 - 1


def validate_token(token: object) -> int:
    """A non-negative int no larger than :data:`MAX_STORED_TOKEN` (bool is not a token)."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int, not {type(token).__name__}")
    if token < 0:
        raise ValueError(f"token must be non-negative, got {token}")
    if token > MAX_STORED_TOKEN:
        raise ValueError(f"token must be at most 2**63 - 1, got {token}")
    return int(token)


def validate_resource(resource: object) -> str:
    if not isinstance(resource, str):
        raise TypeError(f"resource must be a str, not {type(resource).__name__}")
    if not resource:
        raise ValueError("resource must be a non-empty string")
    return resource


def validate_value(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"value must be bytes, not {type(value).__name__} (encode str first)")


#: The longest time to live a fenced store accepts for its keys: 10 years. Longer is no
#: different from no expiry at all (``ttl=None``), and is more likely a unit mistake.
MAX_STORED_TTL = 10 * 365 * 86400.0


def validate_ttl(ttl: object) -> float | None:
    """None (the keys never expire), or a finite number of seconds in ``[0.001, MAX_STORED_TTL]``
    (Redis expiries are in milliseconds; bool is not a duration)."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise TypeError(f"ttl must be a number of seconds or None, not {type(ttl).__name__}")
    try:
        seconds = float(ttl)
    except OverflowError:  # an int beyond float range
        raise ValueError(f"ttl={ttl!r} s is larger than any usable duration") from None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"ttl must be finite, got {ttl!r}")
    if seconds <= 0:
        raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
    if seconds < 0.001:
        raise ValueError(f"ttl must be at least 0.001 s (Redis expiries are in ms), got {ttl!r}")
    if seconds > MAX_STORED_TTL:
        raise ValueError(f"ttl={ttl!r} s is larger than the maximum {MAX_STORED_TTL:g} s "
                         f"(10 years; use ttl=None for data that never expires)")
    return seconds
