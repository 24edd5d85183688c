"""Lua shared by the lock scripts (:mod:`redlock._scripts.lock`) and the lock family's
(:mod:`redlock._scripts.family`): the membership check, the node's format, the fence
counters, the waiting line. Each is source text that a script prepends to its own."""

from __future__ import annotations

from redlock._scripts.node import FORMAT, FORMAT_PREFIX, HORIZON_SLACK_MS, SERVER_RUN
from redlock._scripts.script import Script

# -- membership (docs/design.md §13) ---------------------------------------------------
#
# Every script that grants, commits or renews takes the node's lease horizon and membership
# record as its last two keys and the client's epoch as its last argument, and starts with
# EPOCH_CHECK: a node whose record's epoch is above the client's, or that a change retired, refuses
# with the record and changes nothing; the rest of the script sees KEYS and ARGV without them
# (local copies shadow the globals), so its own indexes are unchanged. Both node keys are
# declared, as Redis asks of every key a script touches (on a cluster node they are the copies
# of the resource's hash slot, docs/design.md §11.4). A script's usual case may come between the two
# (``guarded(usual=...)``): the call that goes no further makes no copies.

STALE_EPOCH = -3  # {-3, epoch, members, joining, retired}: the client must adopt it

EPOCH_CHECK = """
-- KEYS[#KEYS - 1] the node's lease horizon (docs/design.md §4.3.1),
-- KEYS[#KEYS] the node's membership record (hash: epoch, members, joining, retired),
-- ARGV[#ARGV] the client's epoch, on a cluster node followed by the run of the server its
-- connection identified ('<epoch> <run>': node_format compares a hash slot's stamp with
-- it, docs/proposals/cluster.md P3.1a); refuses with {-3, epoch, members, joining, retired}
local HORIZON_KEY, MEMBERS_KEY = KEYS[#KEYS - 1], KEYS[#KEYS]
local CLIENT_EPOCH, CLIENT_RUN = tonumber(ARGV[#ARGV]), nil
if not CLIENT_EPOCH then
    local epoch, run = string.match(ARGV[#ARGV], '^(%d+) (%S+)$')
    CLIENT_EPOCH, CLIENT_RUN = tonumber(epoch), run
end
do
    local record = redis.call('HMGET', MEMBERS_KEY, 'epoch', 'members', 'joining', 'retired')
    local epoch = tonumber(record[1] or '0') or 0
    if epoch > CLIENT_EPOCH or record[4] == '1' then
        return {-3, epoch, record[2] or '', record[3] or '', record[4] or ''}
    end
end
"""
WITHOUT_EPOCH = """
local KEYS = {unpack(KEYS, 1, #KEYS - 2)}
local ARGV = {unpack(ARGV, 1, #ARGV - 1)}
"""


def guarded(name: str, source: str, *, usual: str = "", copies: bool = True,
            checked_usual: bool = True) -> Script:
    """A granting, committing or renewing script, behind :data:`EPOCH_CHECK`. ``usual``: its usual
    case, run after the check on KEYS and ARGV as sent (the horizon, the membership key and
    the epoch still last: it may use only indexes below them), before ``source``.
    ``copies=False``: ``source`` too reads only such indexes, and goes without the copies of
    KEYS and ARGV (a renewal, on every call). ``checked_usual=False``: the usual case runs
    before the check, which it must then make needless: it may change something only where
    the node has no membership record (the check passes there for every client, whose epoch
    is 0 or more, and nothing retired the node)."""
    if not checked_usual:
        return Script(name, usual + EPOCH_CHECK + (WITHOUT_EPOCH if copies else "") + source,
                      replicated=True)
    return Script(name, EPOCH_CHECK + usual + (WITHOUT_EPOCH if copies else "") + source,
                  replicated=True)


# -- the node's format and fence counters (docs/design.md §3, §4.1) ---------------------
#
# ``node_format``: 0 for no marker (it refuses to grant), 1 for this client's format, else
# the other format the marker names (-1: none this client reads). On a cluster node (a
# marker key with a hash tag: namespaces have no braces) a marker stamped by another server
# run than the one running the script counts as none: the hash slot's history may be
# broken by a failover or a reshard (docs/proposals/cluster.md P3.1a); a granting or
# committing script passes the run its client identified (CLIENT_RUN, EPOCH_CHECK), else
# the script asks INFO. A resource's counter is one field (its bucket) of the node's hash
# of counters.

#: A granting script's refusal on a node whose marker names another format than this
#: client's: ``{-4, format}`` (-1: it names none this client reads), nothing changed.
OTHER_FORMAT = -4

TOKEN_FUNCTIONS = SERVER_RUN + f"""
-- ``run``: the server's run as the client's connection identified it (nil: asked here).
local function node_format(marker, run)
    local value = redis.call('GET', marker)
    if not value then
        return 0
    end
    if string.sub(value, 1, {len(FORMAT_PREFIX)}) == '{FORMAT_PREFIX}' then
        if string.find(marker, '{{', 1, true)
                and not string.find(value, ' run_id=' .. (run or server_run()) .. ' ', 1, true) then
            return 0
        end
        return 1
    end
    local other = tonumber(string.match(value, '^format=(%d+) '))
    return (other and other > {FORMAT}) and other or -1
end
-- The highest value this node's counters hold for the resource (and the floor).
local function highest(counters, bucket, floor)
    return math.max(tonumber(redis.call('HGET', counters, bucket) or '0'), floor)
end
-- The resource's counter on this node becomes max(its bucket, floor) + step, returned:
-- a grant (step 1), a refresh of our own key (step 0, floor 0), a write-back or a set's token
-- (step 0, floor = that token). HINCRBY keeps the stored value an integer string (no Lua float
-- formatting). A grant raises the bucket first and reads what it was from the reply: one command
-- where the bucket holds the highest value (nearly always), not two.
local function settle(counters, bucket, floor, step)
    if step == 1 then
        local raised = redis.call('HINCRBY', counters, bucket, 1)
        if floor + 1 > raised then
            redis.call('HINCRBY', counters, bucket, floor + 1 - raised)
            return floor + 1
        end
        return raised
    end
    local counter = tonumber(redis.call('HGET', counters, bucket) or '0')
    if floor > counter then
        redis.call('HINCRBY', counters, bucket, floor - counter)
        return floor
    end
    return counter
end
"""


# -- the node's lease horizon (docs/design.md §4.3.1) ----------------------------------
#
# ``ns:node:horizon``: its expiry is, within HORIZON_SLACK_MS, the latest of any lease the
# node granted or extended; a declared key of every script that raises it.

def raise_horizon(horizon: str, ttl: str) -> str:
    """Lua (a block) that raises the node's lease horizon to a lease of ``ttl`` ms from
    now; ``horizon`` and ``ttl`` are Lua expressions: the horizon's key name (a declared
    key), the TTL. One PTTL, and a SET only when the lease ends past the key by the slack."""
    return (f"if redis.call('PTTL', {horizon}) < tonumber({ttl}) - {HORIZON_SLACK_MS} then\n"
            f"redis.call('SET', {horizon}, '1', 'PX', {ttl}) end\n")


# -- the waiting line (docs/design.md §6.3) --------------------------------------------
#
# Per resource, a sorted set of waiter ids by ticket, and one of their deadlines by the node's
# clock (each attempt pushes its entry's back by the patience). Both expire with their last entry.

# A lock value starts with its acquire call's secret, this many hex digits, drawn once per call;
# then comes its attempt's number (docs/design.md §2.1; redlock._core.tokens makes them).
CALL_DIGITS = 32

VALUE_FUNCTIONS = f"""
-- Lock values are '<call><attempt>' (docs/design.md §2.1): the acquire call's secret,
-- {CALL_DIGITS} hex digits, then its attempt's number in 8, so two values of one call
-- compare as their attempts do.
local function call_of(value)
    return string.sub(value, 1, {CALL_DIGITS})
end
local function attempt_of(value)
    return string.sub(value, {CALL_DIGITS + 1})
end
-- A waiter is its call: SHA1 of the secret, the same for every attempt (the lock value
-- itself is never shown); a holder is shown by the first 12 hex digits of it.
local function waiter_of(value)
    return redis.sha1hex(call_of(value))
end
local function holder_id(value)
    return string.sub(waiter_of(value), 1, 12)
end
-- Whose `held` is, seen from `value`: 1 its own or an earlier attempt's of its call (the
-- later attempt takes it over), -1 a later attempt's (`value`'s command came late: it
-- must change nothing), 0 someone else's, or nothing.
local function kin(held, value)
    if held == value then
        return 1
    end
    if not held or #held ~= #value or call_of(held) ~= call_of(value) then
        return 0
    end
    return held < value and 1 or -1
end
"""

LINE_FUNCTIONS = """
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Drop the entries whose deadline passed (their waiters stopped asking), and their
-- hand-off records (``ttls``, a mutex's line only: docs/design.md §6.7).
local function drop_lapsed(line, deadlines, now, ttls)
    local lapsed = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now, 'LIMIT', 0, 100)
    for _, waiter in ipairs(lapsed) do
        redis.call('ZREM', line, waiter)
        redis.call('ZREM', deadlines, waiter)
        if ttls then
            redis.call('HDEL', ttls, waiter)
        end
    end
end
-- Publish on the release channel the waiter id of the first in line ('' when nobody is
-- in line): only that waiter wakes (docs/design.md §6). Only a hint that wakes a waiter
-- early: a user without channel permissions (Redis 7 ACL resetchannels) must still
-- release cleanly, so errors are ignored. ``giver``: the waiter id of a failed attempt
-- releasing its grant (nil for a holder's release): then only another waiter, named, wakes.
-- A message naming nobody, or the giver, would wake the giver itself, which would try
-- again at once, as fast as round trips go (docs/design.md §6.4).
local function wake_first(line, deadlines, channel, now, giver)
    local first = ''
    if redis.call('EXISTS', line) == 1 then
        drop_lapsed(line, deadlines, now)
        first = redis.call('ZRANGE', line, 0, 0)[1] or ''
    end
    if not giver or (first ~= '' and first ~= giver) then
        redis.pcall('PUBLISH', channel, first)
    end
end
-- Set an entry's deadline; both keys (and the hand-off records, ``ttls``, if given)
-- expire with the last entry.
local function keep_until(line, deadlines, waiter, until_ms, now, ttls)
    redis.call('ZADD', deadlines, until_ms, waiter)
    local last = tonumber(redis.call('ZRANGE', deadlines, -1, -1, 'WITHSCORES')[2])
    redis.call('PEXPIRE', line, last - now + 1)
    redis.call('PEXPIRE', deadlines, last - now + 1)
    if ttls then
        redis.call('PEXPIRE', ttls, last - now + 1)
    end
end
-- Put a waiter in line at its ``ticket`` (its place: the same on every node and
-- attempt, so a waiter already there keeps it) until ``until_ms``.
local function enter_line(line, deadlines, waiter, ticket, until_ms, now, ttls)
    redis.call('ZADD', line, ticket, waiter)
    keep_until(line, deadlines, waiter, until_ms, now, ttls)
end
-- A reservation: the value a release's hand-off sets for the first in line
-- (docs/design.md §6.7). Lock values are hex digits: none has this prefix.
local function reservation(waiter)
    return 'handoff:' .. waiter
end
"""
