"""Lua scripts of the operator tools (:mod:`redlock._core.inspect`): read a lock's state on a node,
and delete a lock's key whoever holds it. The conventions of :mod:`redlock._scripts.lock` hold (a
header per script naming its KEYS, ARGV and replies); that module re-exports both."""

from __future__ import annotations

from redlock._scripts.script import Script
from redlock._scripts.shared import LINE_FUNCTIONS, TOKEN_FUNCTIONS, VALUE_FUNCTIONS

INSPECT = Script(
    "inspect",
    """
-- KEYS[1] lock key, KEYS[2] node fence counters, KEYS[3] node marker key,
-- KEYS[4] repair claim key, KEYS[5] amnesia episode key
-- ARGV[1] the resource's bucket
-- returns {pttl, fence, marker, repairing, holder, episode, now}; writes nothing
--   pttl       PTTL of the lock key: -2 free, -1 a key without expiry, else ms left
--   fence      the highest token this node can have given the resource: its bucket's
--              counter
--   marker     the node's format: 1 this client's, 0 no marker, else the other format
--              its marker names (-1: none this client reads)
--   repairing  1 when a repair has claimed the node, else 0
--   holder     the first 12 hex digits of its waiter id, SHA1 of the lock value's call
--              part (docs/design.md §2.1), '' when free: tells holders apart without
--              revealing the lock value (which would let anyone release)
--   episode    the amnesia episode ('<since ms> <run id> <why>'), '' when none
--   now        this node's clock in ms (the episode's age is measured on it)
""" + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + """
local value = redis.call('GET', KEYS[1])
local holder = ''
if value and string.sub(value, 1, 8) == 'handoff:' then
    -- a reservation (docs/design.md §6.7): for its waiter id
    holder = string.sub(value, 9, 20)
elseif value then
    holder = holder_id(value)
end
local t = redis.call('TIME')
return {redis.call('PTTL', KEYS[1]), highest(KEYS[2], ARGV[1], 0),
        node_format(KEYS[3]), redis.call('EXISTS', KEYS[4]), holder,
        redis.call('GET', KEYS[5]) or '',
        tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
""",
)

FORCE_RELEASE = Script(
    "force_release",
    """
-- KEYS[1] lock key, KEYS[2] release notification channel, KEYS[3] waiting line,
-- KEYS[4] line deadlines
-- returns 1 when a key was deleted, 0 when there was none
-- Deletes whoever's key it is (an operator's tool); the fence counter stays, so the next
-- holder's token is still larger than the evicted holder's. Wakes the first in line.
""" + LINE_FUNCTIONS + """
if redis.call('DEL', KEYS[1]) == 1 then
    wake_first(KEYS[3], KEYS[4], KEYS[2], now_ms())
    return 1
end
return 0
""",
)
