"""Lua scripts run atomically on each Redis node (the keys: docs/design.md's key table). Every
script is a module constant with a header naming its KEYS, ARGV and replies; reply codes are named
here, and :mod:`redlock._scripts.replies` is the one place that reads replies."""

from __future__ import annotations

from redlock._scripts.script import Script

# The membership check, the fence counters and the waiting line, shared with the lock
# family's scripts (docs/design.md §13, §3, §6).
from redlock._scripts.shared import (
    LINE_FUNCTIONS,
    OTHER_FORMAT,
    TOKEN_FUNCTIONS,
    VALUE_FUNCTIONS,
    guarded,
    raise_horizon,
)

# Reply codes of ACQUIRE (first element of the reply array).
ACQUIRE_REFUSED = 0  # another owner holds the key; second element: its PTTL in ms
ACQUIRE_GRANTED = 1  # we set the key; second element: the new fence counter
ACQUIRE_ALREADY_OURS = 2  # ours already: an earlier attempt of the call set it; counter as is
ACQUIRE_AMNESIAC = -1  # the node has no marker: it may have forgotten locks and counters
ACQUIRE_NOT_YOUR_TURN = 3  # free, but others are first in line; second element: how many
ACQUIRE_OTHER_FORMAT = OTHER_FORMAT  # the marker names another format; second element: it

ACQUIRE = guarded(
    "acquire",
    usual="""
-- KEYS[1] lock key, KEYS[2] node fence counters (hash), KEYS[3] node marker key,
-- KEYS[4] waiting line (zset: waiter id by ticket), KEYS[5] line deadlines (zset: by ms),
-- KEYS[6] the line's hand-off records (hash: waiter id -> '<ttl_ms> <attempt> <floor>[
-- <route>]')
-- ARGV[1] lock value, ARGV[2] ttl in ms, ARGV[3] token floor (highest counter the client saw)
-- ARGV[4] ticket: the waiter's place in line ('' for a single try, which does not queue)
-- ARGV[5] patience in ms: how long the entry stays without a new attempt from its waiter
-- ARGV[6] the resource's bucket: its field in KEYS[2]
-- ARGV[7] the attempt's number ('' or absent: no record, so no hand-off to this waiter;
-- docs/design.md §6.7), ARGV[8] the waiter's route, 8 hex digits: a hand-off to it is
-- published on '<release channel>:<route>', heard by its manager only (absent or
-- anything else: on the release channel)
-- returns {1, token}     granted: SET NX PX done and token = max(counters, floor) + 1
--                        (the key held a reservation for us, §6.7: SET, and token =
--                        max(counters, floor): the hand-off raised it)
--                        (a waiter granted as first in line keeps its place until its
--                        call is over: RELEASE with leave '1')
--         {2, token}     the key already holds our lock value, or an earlier attempt's
--                        of our call (§2.1): it holds ours now, TTL refreshed; token =
--                        the counter as it is now (no new one)
--         {0, pttl}      held by another owner, pttl ms left (a ticket joins the line);
--                        or by a later attempt of our call: this acquire came late, and
--                        changes nothing
--         {3, ahead}     free, but `ahead` waiters are before us in line (a ticket joins it)
--         {-1, 0}        no node marker (on a cluster node: or one stamped by another server
--                        run): amnesiac node, refuses until repaired
--         {-4, format}   the marker names another format than this client's (-1: none
--                        it reads): a newer release's node, which this client must not
--                        use (docs/design.md §4.1); nothing changed
-- The usual case first (docs/design.md §2.2): a marker, no membership record, no line, told by
-- one EXISTS that counts a key once per mention (the record, named four times, makes 4 or more,
-- the line 2, the marker 1). Its format is checked on every new connection (IDENTIFY, §4.4);
-- on a cluster node (a marker with a hash tag) its stamp, on every call: it must name the run
-- the client's connection identified (the epoch's argument '<epoch> <run>'), else the
-- script goes on to node_format, which asks INFO (docs/proposals/cluster.md P3.1a).
local marker, line, record, horizon = KEYS[3], KEYS[4], KEYS[#KEYS], KEYS[#KEYS - 1]
local present = redis.call('EXISTS', marker, line, line, record, record, record, record)
local usual = present == 1
if usual and string.find(marker, '{', 1, true) then
    local run = string.match(ARGV[#ARGV], ' (%S+)$')
    usual = run ~= nil
        and string.find(redis.call('GET', marker), ' run_id=' .. run .. ' ', 1, true) ~= nil
end
if usual and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    -- Free, and granted: the node's lease horizon (docs/design.md §4.3.1), and the
    -- token as settle(..., 1) makes it.
""" + raise_horizon("horizon", "ARGV[2]") + """
    local raised = redis.call('HINCRBY', KEYS[2], ARGV[6], 1)
    local token = math.max(raised, tonumber(ARGV[3]) + 1)
    if token > raised then
        redis.call('HINCRBY', KEYS[2], ARGV[6], token - raised)
    end
    return {1, token}
end
""",
    checked_usual=False,
    source=LINE_FUNCTIONS + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + """
local format = usual and 1 or node_format(KEYS[3], CLIENT_RUN)
if format == 0 then
    return {-1, 0}
elseif format ~= 1 then
    return {-4, format}
end
local queued = present % 4 >= 2
-- Free, and nobody in line: one command checks and sets the key (the usual case tried it above).
if not usual and not queued and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
    return {1, settle(KEYS[2], ARGV[6], tonumber(ARGV[3]), 1)}
end
local holder = redis.call('GET', KEYS[1])
local ours = kin(holder, ARGV[1])
if ours == 1 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
    return {2, settle(KEYS[2], ARGV[6], 0, 0)}
elseif ours == -1 then
    -- A later attempt of our call set it: this one is over (a reply lost, a connection
    -- stalled), and must neither take the key back nor touch the line (§2.1).
    return {0, redis.call('PTTL', KEYS[1])}
end
local ttls = KEYS[6]
local attempt = ARGV[7] or ''
if holder and string.sub(holder, 1, 8) == 'handoff:' then
    local me = waiter_of(ARGV[1])
    if holder == reservation(me) then
        -- A release handed the lock to us (docs/design.md §6.7): granted, first in line
        -- (the place is kept as below). The hand-off raised the counter while the
        -- reservation, our key, was here: as it is now (or the floor) it is current, as
        -- for code 2, and a second raise would only set the nodes apart.
        local now = now_ms()
        if ARGV[4] ~= '' and redis.call('ZSCORE', KEYS[4], me) then
            keep_until(KEYS[4], KEYS[5], me,
                       now + math.min(tonumber(ARGV[5]), tonumber(ARGV[2])), now, ttls)
        end
        if ttls then
            redis.call('HDEL', ttls, me)
        end
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
        return {1, settle(KEYS[2], ARGV[6], tonumber(ARGV[3]), 0)}
    end
end
local now = now_ms()
local me = waiter_of(ARGV[1])
if queued then
    drop_lapsed(KEYS[4], KEYS[5], now, ttls)
end
-- Join the line, or keep our place: the ticket is the same on every attempt.
local function wait_in_line(until_ms)
    if ARGV[4] == '' then
        return
    end
    enter_line(KEYS[4], KEYS[5], me, ARGV[4], until_ms, now, ttls)
end
-- Refused in line: record what a release needs to hand the lock to us (§6.7).
local function record_handoff()
    if ARGV[4] ~= '' and ttls and attempt ~= '' then
        local record = ARGV[2] .. ' ' .. attempt .. ' ' .. ARGV[3]
        local route = ARGV[8]
        if route and string.match(route, '^%x%x%x%x%x%x%x%x$') then
            record = record .. ' ' .. route
        end
        redis.call('HSET', ttls, me, record)
    end
end
if holder then
    local pttl = redis.call('PTTL', KEYS[1])
    record_handoff()
    wait_in_line(now + tonumber(ARGV[5]))
    return {0, pttl}
end
local first = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
if first and first ~= me then
    record_handoff()
    wait_in_line(now + tonumber(ARGV[5]))
    return {3, redis.call('ZRANK', KEYS[4], me) or redis.call('ZCARD', KEYS[4])}
end
if first then
    -- Granted, first in line: the place is kept until the acquire call is over (its
    -- RELEASE with leave '1'). A failed attempt (no quorum) must not lose it on the
    -- nodes that granted: the lines would then disagree and two waiters could each be
    -- first on half of the nodes, again and again. It lapses with our key at the
    -- latest (a holder that died or froze must not block the line past its TTL); the
    -- failed attempt's RELEASE (leave '0') gives it the patience again.
    wait_in_line(now + math.min(tonumber(ARGV[5]), tonumber(ARGV[2])))
    if ttls then
        redis.call('HDEL', ttls, me)
    end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
return {1, settle(KEYS[2], ARGV[6], tonumber(ARGV[3]), 1)}
""",
)

# A set of resources at once, atomically on each node: every key set or none, so no
# node holds part of a set and nobody holds one resource while waiting for another (no
# hold-and-wait: overlapping sets cannot deadlock). Same reply shape as ACQUIRE.
ACQUIRE_MANY = guarded(
    "acquire_many",
    """
-- KEYS[1] node marker, KEYS[2] node fence counters, KEYS[3..k+2] lock keys
-- ARGV[1] lock value, ARGV[2] ttl in ms, ARGV[3] token floor, ARGV[4..k+3] the
-- resources' buckets (fields of KEYS[2], same order)
-- returns {-1, 0}          no node marker: amnesiac node, refuses
--         {-4, format}     the marker names another format (see ACQUIRE): refuses
--         {0, pttl}        some key is held by another owner (or by a later attempt of
--                          our call, §2.1): nothing set; pttl = the longest PTTL among
--                          those keys (-1: a key without expiry)
--         {1, t, ..., t}   every key set (or already ours, or an earlier attempt's of our
--                          call: ours now, TTL refreshed); one token t
--                          for the whole set, one above every counter involved (or, when
--                          every key was ours already, the highest of them as it is), to
--                          which every member's bucket is raised
""" + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + """
local format = node_format(KEYS[1], CLIENT_RUN)
if format == 0 then
    return {-1, 0}
elseif format ~= 1 then
    return {-4, format}
end
local k = #KEYS - 2
local blocked, longest, fresh = false, -1, false
for i = 1, k do
    local holder = redis.call('GET', KEYS[2 + i])
    if holder and kin(holder, ARGV[1]) ~= 1 then
        blocked = true
        local pttl = redis.call('PTTL', KEYS[2 + i])
        if pttl < 0 then
            longest = -1
            break
        end
        if pttl > longest then
            longest = pttl
        end
    elseif not holder then
        fresh = true
    end
end
if blocked then
    return {0, longest}
end
local token = tonumber(ARGV[3])
for i = 1, k do
    token = highest(KEYS[2], ARGV[3 + i], token)
end
if fresh then
    token = token + 1
end
local reply = {1}
for i = 1, k do
    redis.call('SET', KEYS[2 + i], ARGV[1], 'PX', ARGV[2])
    settle(KEYS[2], ARGV[3 + i], token, 0)
    reply[#reply + 1] = token
end
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
return reply
""",
)

WRITE_BACK = guarded(
    "write_back",
    """
-- KEYS[1] lock key, KEYS[2] node fence counters, KEYS[3] node marker key
-- ARGV[1] lock value, ARGV[2] token, ARGV[3] the resource's bucket
-- returns 1 when the node still holds our lock key and now has counter >= token, else 0
-- (also where the marker is missing or of another format: not counted)
-- (a reservation for us, docs/design.md §6.7, is our key: it becomes our lock value,
-- with the PTTL it had; another attempt's value of our call is not this attempt's grant)
-- The value check is what makes the write-back safe: counting a node that does not
-- hold our key could let a stale token overtake a committed one (docs/design.md §3.3).
""" + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + """
if node_format(KEYS[3], CLIENT_RUN) ~= 1 then
    return 0
end
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then
    if holder ~= 'handoff:' .. waiter_of(ARGV[1]) then
        return 0
    end
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl > 0 then
        redis.call('SET', KEYS[1], ARGV[1], 'PX', pttl)
    else
        redis.call('SET', KEYS[1], ARGV[1])
    end
end
settle(KEYS[2], ARGV[3], tonumber(ARGV[2]), 0)
return 1
""",
)

RELEASE = Script(
    "release",
    """
-- KEYS[1] lock key, KEYS[2] release notification channel,
-- KEYS[3] waiting line, KEYS[4] line deadlines (see ACQUIRE)
-- KEYS[5] the line's hand-off records, KEYS[6] node fence counters, KEYS[7] node marker,
-- KEYS[8] the node's membership record, KEYS[9] its lease horizon (KEYS[5..9] absent: no
-- hand-off)
-- ARGV[1] lock value, ARGV[2] '1': also leave the line (the acquire call is over: the
-- key goes if any attempt of our call set it, §2.1), '0': keep our place (a failed
-- attempt that will try again: the key goes only if this attempt set it); ARGV[3] (with
-- '0') the patience in ms: our entry, cut to our key's TTL when it was granted, lasts
-- that long ('' or absent: none); ARGV[4] the resource's bucket (a field of KEYS[6]); ARGV[5]
-- (with '0' and a patience) the waiter's ticket: its entry is put back where it is not
-- in the line (a grant on an empty line did not enter it, §6.3) ('' or absent: none)
-- returns 1 when our key was deleted, 0 when the key is absent or not ours to delete
-- When the lock became free, hands it to the first in line if that waiter left a hand-off
-- record and listens (docs/design.md §6.7: the reservation, the counter, the message and its
-- channel), else publishes the first's waiter id ('' when nobody is in line, §6.4). No
-- hand-off on a node without its marker (or of another format), or retired. With '1', a
-- reservation for us is our key; with '0' it is left alone.
local holder = redis.call('GET', KEYS[1])
local queued = redis.call('EXISTS', KEYS[3]) == 1
local ticket = ARGV[5] or ''
-- The usual case first, before the shared functions are defined (a script defines them
-- anew on every call): our key, nobody in line, no place to put back. What the rest of
-- the script does then: delete, and (but for a failed attempt's) publish that nobody is first.
if holder == ARGV[1] and not queued and ticket == '' then
    redis.call('DEL', KEYS[1])
    if ARGV[2] ~= '0' then
        redis.pcall('PUBLISH', KEYS[2], '')
    end
    return 1
end
""" + LINE_FUNCTIONS + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + """
local ttls = KEYS[5]
-- Our waiter id, where a line or a reservation needs it (most releases: neither, and
-- SHA1 is the costliest step of this script without them).
local me = nil
if queued or ticket ~= '' or (holder and string.sub(holder, 1, 8) == 'handoff:') then
    me = waiter_of(ARGV[1])
end
local released = 0
if holder == ARGV[1] or (ARGV[2] == '1' and holder and (call_of(holder) == call_of(ARGV[1])
                                                      or (me and holder == reservation(me)))) then
    redis.call('DEL', KEYS[1])
    released = 1
end
local left = 0
if ARGV[2] == '1' and queued then
    left = redis.call('ZREM', KEYS[3], me)
    redis.call('ZREM', KEYS[4], me)
    if ttls then
        redis.call('HDEL', ttls, me)
    end
elseif ARGV[3] and ARGV[3] ~= '' and released == 1 then
    -- A failed attempt keeps its place for the patience; with its ticket, it also gets
    -- one where its grant found the line empty, as the nodes that refused it gave it
    -- one: the lines agree on who is first (§6.3).
    if ticket ~= '' or (queued and redis.call('ZSCORE', KEYS[3], me)) then
        local now = now_ms()
        if ticket ~= '' then
            enter_line(KEYS[3], KEYS[4], me, ticket, now + tonumber(ARGV[3]), now, ttls)
        else
            keep_until(KEYS[3], KEYS[4], me, now + tonumber(ARGV[3]), now, ttls)
        end
    end
end
if released == 0 and (left == 0 or redis.call('EXISTS', KEYS[1]) == 1) then
    return released
end
local now = 0
local first = ''
if queued and redis.call('EXISTS', KEYS[3]) == 1 then  -- (our ZREM may have emptied it)
    now = now_ms()
    drop_lapsed(KEYS[3], KEYS[4], now, ttls)
    first = redis.call('ZRANGE', KEYS[3], 0, 0)[1] or ''
end
local message = first
local channel = KEYS[2]
if first ~= '' and first ~= me and ttls then
    local record = redis.call('HGET', ttls, first)
    local members = redis.call('HMGET', KEYS[8], 'epoch', 'retired')
    if record and node_format(KEYS[7]) == 1 and members[2] ~= '1' then
        local ttl, attempt, floor, route = string.match(record, '^(%d+) (%d+) (%d+) ?(%x*)$')
        if ttl and route ~= '' then  -- told to the waiter's manager only (§6.7)...
            channel = KEYS[2] .. ':' .. route
            -- ...and handed to it only if it listens here: a manager that died closed
            -- its connections, and a reservation would hold the lock from everyone for
            -- the TTL. Unheard (or not yet subscribed here), the waiter stays first,
            -- and acquires the lock with its next attempt or lapses after its patience.
            local heard = redis.pcall('PUBSUB', 'NUMSUB', channel)
            if type(heard) == 'table' and heard[2] == 0 then  -- (an error: handed off, as before)
                ttl, channel = nil, KEYS[2]
            end
        end
        if ttl then
            redis.call('SET', KEYS[1], reservation(first), 'PX', ttl)
""" + raise_horizon("KEYS[9]", "ttl") + """
            local counter = settle(KEYS[6], ARGV[4], tonumber(floor), 1)
            local deadline = tonumber(redis.call('ZSCORE', KEYS[4], first))
            local cut = now + tonumber(ttl)
            if deadline and deadline < cut then
                cut = deadline
            end
            keep_until(KEYS[3], KEYS[4], first, cut, now, ttls)
            redis.call('HDEL', ttls, first)
            message = first .. ' ' .. string.format('%.0f', counter) .. ' ' .. (members[1] or '0')
                .. ' ' .. attempt
        end
    end
end
-- A failed attempt's release ('0') wakes only another waiter, named (see wake_first).
if ARGV[2] ~= '0' or (first ~= '' and first ~= me) then
    redis.pcall('PUBLISH', channel, message)
end
return released
""",
)

EXTEND = guarded(
    "extend",
    copies=False,
    source="""
-- KEYS[1] lock key
-- ARGV[1] lock value, ARGV[2] new ttl in ms
-- returns 1 when our key was still there and its TTL was reset, else 0 (a reservation
-- for us, docs/design.md §6.7, is our key: it becomes our lock value)
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
    return 1
end
-- (The shared functions only past the usual case: a renewal, on every call.)
""" + VALUE_FUNCTIONS + """
if holder and holder == 'handoff:' .. waiter_of(ARGV[1]) then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
    return 1
end
return 0
""",
)

# -- hand-over (redlock/_core/handover.py) ---------------------------------------------

OWNED_PTTL = Script(
    "owned_pttl",
    """
-- KEYS[1] lock key
-- ARGV[1] lock value
-- returns the key's PTTL in ms when it holds this lock value (or a reservation for it,
-- docs/design.md §6.7), else -2
""" + VALUE_FUNCTIONS + """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or (holder and holder == 'handoff:' .. waiter_of(ARGV[1])) then
    return redis.call('PTTL', KEYS[1])
end
return -2
""",
)
