"""Argument checks shared by the stores (TypeError for the wrong type, ValueError for
a wrong value)."""

from __future__ import annotations

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
