"""A Lua script as the library sends it: EVALSHA by its SHA1, EVAL with its body on a
connection the server has not seen it on yet, or after NOSCRIPT."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Script:
    """A Lua script with its SHA1, so the transports can EVALSHA and fall back to EVAL."""

    name: str
    source: str
    #: Whether a call of it grants, commits or renews (the scripts behind EPOCH_CHECK): with
    #: ``replica_acks``, its reply counts only once replicas have its writes (WAIT,
    #: docs/design.md §11.3).
    replicated: bool = False
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())
