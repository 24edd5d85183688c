"""Redis Cluster hash slots (docs/design.md §11.4): the hash slot a key is stored in, and
the hash tag that puts a node key in a given hash slot. On a cluster node each hash slot
keeps its own copy of the node's keys (``ns:node:{T}:marker``...), beside the resources
stored in it, so that a script touches one hash slot and a fence counter moves with its
hash slot when the cluster is resharded. ("Hash slot", not "slot": a permit's slot is
another thing, §12.2.)"""

from __future__ import annotations

from binascii import crc_hqx

from redlock._scripts.hash_slot_tags import TABLE, WIDTH

#: The hash slots of a Redis Cluster.
HASH_SLOTS = 16384


def hash_slot(key: str | bytes) -> int:
    """The hash slot Redis Cluster stores ``key`` in: CRC16 (XMODEM) of its hash tag, the
    text between its first ``{`` and the first ``}`` after it when that is not empty, else
    of the whole key."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    return crc_hqx(data, 0) % HASH_SLOTS


def tag_of(slot: int) -> str:
    """The shortest text over ``[0-9a-z]`` (the first in that order) that hashes to hash
    slot ``slot``: ``{tag}`` in a key stores the key there. Part of the node format."""
    if isinstance(slot, bool) or not isinstance(slot, int):
        raise TypeError(f"a hash slot is an int, not {type(slot).__name__}")
    if not 0 <= slot < HASH_SLOTS:
        raise ValueError(f"a hash slot is in 0..{HASH_SLOTS - 1}, got {slot}")
    return TABLE[WIDTH * slot:WIDTH * slot + WIDTH].rstrip()
