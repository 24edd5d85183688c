"""Lua scripts of the lock family (docs/design.md §12): what the mutex's scripts
(:mod:`redlock._scripts.lock`) do not already serve with the kind's keys. Every script that grants,
commits or renews starts with the membership check (``guarded``, §13.1), every granting one then
with the marker check (§4, §4.1), and takes tokens with the mutex's ``settle``."""

from __future__ import annotations

from redlock._scripts.script import Script
from redlock._scripts.shared import (
    LINE_FUNCTIONS,
    TOKEN_FUNCTIONS,
    VALUE_FUNCTIONS,
    guarded,
    raise_horizon,
)

# A node holds a permit of slot K or above: a client configured with more permits uses
# the name (SEM_ACQUIRE; second element: this client's K).
SEM_MORE_PERMITS = -2

# -- leader election (§12.1) -------------------------------------------------------------

PROCLAIM = guarded(
    "proclaim",
    """
-- KEYS[1] the election's leader key, KEYS[2] its term record, KEYS[3] the elected channel
-- ARGV[1] lock value, ARGV[2] term, ARGV[3] identity
-- returns 1 when the node still holds our leadership and now records our term, else 0
-- The record (<term> <holder> <identity>, holder = first 12 hex digits of the waiter
-- id, SHA1 of the lock value's call part, docs/design.md §2.1)
-- lives as long as the leader key; an observer is woken with the identity.
""" + VALUE_FUNCTIONS + """
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 or redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local holder = holder_id(ARGV[1])
redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. holder .. ' ' .. ARGV[3], 'PX', pttl)
redis.pcall('PUBLISH', KEYS[3], '')
return 1
""",
)

EXTEND_LEADER = guarded(
    "extend_leader",
    """
-- KEYS[1] the election's leader key, KEYS[2] its term record
-- ARGV[1] lock value, ARGV[2] new ttl in ms
-- returns 1 when our key was still there and its TTL (and the record's) was reset, else 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
    return 1
end
return 0
""",
)

LEADER = Script(
    "leader",
    """
-- KEYS[1] the election's leader key, KEYS[2] its term record, KEYS[3] node marker
-- returns {pttl, holder, record, format}; writes nothing
--   pttl    PTTL of the leader key (-2: nobody holds it)
--   holder  first 12 hex digits of its waiter id (SHA1 of the lock value's call part),
--           '' when free
--   record  '<term> <holder> <identity>' of the last proclaimed term, '' when none
--   format  the node's format: 1 this client's; 0 no marker, it lost its data, or
--           another (a newer release's, -1 none this client reads): not to be believed
""" + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + """
local value = redis.call('GET', KEYS[1])
local holder = ''
if value then
    holder = holder_id(value)
end
return {redis.call('PTTL', KEYS[1]), holder, redis.call('GET', KEYS[2]) or '',
        node_format(KEYS[3])}
""",
)

# -- counting semaphore (§12.2) ------------------------------------------------------------

SEM_ACQUIRE = guarded(
    "sem_acquire",
    """
-- KEYS[1] node marker, KEYS[2] node fence counters, KEYS[3] the semaphore's line,
-- KEYS[4] line deadlines, KEYS[5] its release channel, KEYS[6..K+5] the slot keys
-- 0..K-1, KEYS[K+6] slot K's key
-- ARGV[1] lock value, ARGV[2] ttl in ms, ARGV[3] token floor, ARGV[4] ticket ('' for a
-- single try), ARGV[5] patience in ms, ARGV[6] preferred slot, ARGV[7..K+6] the slots'
-- buckets (fields of KEYS[2])
-- returns {1, token, slot}  granted: the preferred slot if free, else the lowest free one
--         {2, counter, slot} that slot already holds our lock value, or an earlier
--                            attempt's of our call (§2.1): ours now, TTL refreshed
--         {0, pttl}          every slot is held; pttl = the soonest to expire (ms) (or
--                            one holds a later attempt's of our call: this acquire came
--                            late, and changes nothing)
--         {3, ahead}         free slots, but at least as many waiters are ahead of us
--         {-2, K}            slot K is held: a client with more permits uses the name
--         {-1, 0}            no node marker: amnesiac node, refuses
--         {-4, format}       the marker names another format (see ACQUIRE): refuses
-- A waiter granted leaves the line (several are served at once, §12.2); if slots are
-- left, the next in line is woken.
""" + LINE_FUNCTIONS + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + """
local format = node_format(KEYS[1], CLIENT_RUN)
if format == 0 then
    return {-1, 0}
elseif format ~= 1 then
    return {-4, format}
end
local k = #KEYS - 6
if redis.call('EXISTS', KEYS[k + 6]) == 1 then
    return {-2, k}
end
local free, soonest = {}, -1
for i = 0, k - 1 do
    local key = KEYS[6 + i]
    local holder = redis.call('GET', key)
    local ours = kin(holder, ARGV[1])
    if ours == 1 then
        redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
        return {2, settle(KEYS[2], ARGV[7 + i], 0, 0), i}
    elseif ours == -1 then
        return {0, redis.call('PTTL', key)}
    end
    if holder then
        local pttl = redis.call('PTTL', key)
        if soonest < 0 or pttl < soonest then
            soonest = pttl
        end
    else
        free[#free + 1] = i
    end
end
local now = now_ms()
local me = waiter_of(ARGV[1])
local ahead = 0
if redis.call('EXISTS', KEYS[3]) == 1 then
    drop_lapsed(KEYS[3], KEYS[4], now)
    if ARGV[4] == '' then
        ahead = redis.call('ZCARD', KEYS[3])
    else
        ahead = redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. ARGV[4])
    end
end
if #free > ahead then
    local slot = free[1]
    local preferred = tonumber(ARGV[6])
    for _, i in ipairs(free) do
        if i == preferred then
            slot = i
        end
    end
    redis.call('SET', KEYS[6 + slot], ARGV[1], 'PX', ARGV[2])
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
    if ARGV[4] ~= '' and redis.call('ZREM', KEYS[3], me) == 1 then
        redis.call('ZREM', KEYS[4], me)
        if #free > 1 then
            local next_waiter = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
            if next_waiter then
                redis.pcall('PUBLISH', KEYS[5], next_waiter)
            end
        end
    end
    return {1, settle(KEYS[2], ARGV[7 + slot], tonumber(ARGV[3]), 1), slot}
end
if ARGV[4] ~= '' then
    enter_line(KEYS[3], KEYS[4], me, ARGV[4], now + tonumber(ARGV[5]), now)
end
if #free == 0 then
    return {0, soonest}
end
return {3, ahead}
""",
)

SEM_RELEASE = Script(
    "sem_release",
    """
-- KEYS[1] the semaphore's release channel, KEYS[2] its line, KEYS[3] line deadlines,
-- KEYS[4..] slot keys: the one held (or every slot, when which one is not known)
-- ARGV[1] lock value, ARGV[2] '1': also leave the line (the acquire call is over: a slot
-- goes if any attempt of our call holds it, §2.1; with '0', only if this attempt does)
-- ARGV[3] patience in ms, ARGV[4] ticket: a failed attempt's release (ARGV[2] '0') of
-- a waiter in line, which gets its place back where the grant took it (absent: none)
-- returns 1 when a slot holding our lock value was deleted, 0 when none was ours
-- When a slot became free, publishes the waiter id of the first in line ('' if none).
""" + LINE_FUNCTIONS + VALUE_FUNCTIONS + """
local released = 0
for i = 4, #KEYS do
    local holder = redis.call('GET', KEYS[i])
    if holder == ARGV[1] or (ARGV[2] == '1' and holder and call_of(holder) == call_of(ARGV[1])) then
        redis.call('DEL', KEYS[i])
        released = 1
    end
end
if ARGV[2] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then
    local me = waiter_of(ARGV[1])
    redis.call('ZREM', KEYS[2], me)
    redis.call('ZREM', KEYS[3], me)
end
if released == 1 then  -- (a failed attempt's: SHA1 only then)
    local now = now_ms()
    local me = ARGV[2] == '0' and waiter_of(ARGV[1]) or nil
    if me and ARGV[4] and ARGV[4] ~= '' then
        -- The waiter keeps its place in line on every node (docs/design.md §12.2): a
        -- later waiter must not take the slot here while it is ahead elsewhere.
        enter_line(KEYS[2], KEYS[3], me, ARGV[4], now + tonumber(ARGV[3]), now)
    end
    wake_first(KEYS[2], KEYS[3], KEYS[1], now, me)
end
return released
""",
)

SEM_INSPECT = Script(
    "sem_inspect",
    """
-- KEYS[1..K] the slot keys
-- returns per slot {pttl, holder}: PTTL (-2 free) and the first 12 hex digits of the
-- holder's waiter id (SHA1 of the lock value's call part; '' free); writes nothing
""" + VALUE_FUNCTIONS + """
local reply = {}
for i = 1, #KEYS do
    local value = redis.call('GET', KEYS[i])
    local holder = ''
    if value then
        holder = holder_id(value)
    end
    reply[#reply + 1] = redis.call('PTTL', KEYS[i])
    reply[#reply + 1] = holder
end
return reply
""",
)

# -- read-write lock (§12.3) ---------------------------------------------------------------
#
# The line holds waiters of both modes, scored 2 * ticket + 1 for a writer and 2 * ticket
# for a reader (computed by the client: Lua would print a 16-digit number inexactly):
# the tickets' order, and a score's parity says whether a writer waits there.

_READERS_FUNCTIONS = """
-- The readers' set expires with its last reader.
local function keep_readers(readers, now)
    local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2]
    if last then
        redis.call('PEXPIRE', readers, tonumber(last) - now + 1)
    end
end
"""

RW_ACQUIRE = guarded(
    "rw_acquire",
    """
-- KEYS[1] node marker, KEYS[2] node fence counters, KEYS[3] the writer's key,
-- KEYS[4] the readers (zset: reader id -> expiry ms, node clock; a reader id is the
-- waiter id, then the attempt's number: one entry per attempt, §2.1), KEYS[5] the line,
-- KEYS[6] line deadlines, KEYS[7] the release channel
-- ARGV[1] 'w' write or 'r' read, ARGV[2] lock value, ARGV[3] ttl in ms, ARGV[4] token
-- floor, ARGV[5] line score (2 * ticket + 1 writer, 2 * ticket reader; '' a single try),
-- ARGV[6] patience in ms, ARGV[7] the name's bucket
-- returns {1, token}   write granted: token = counter + 1; read granted: the counter as
--                      it is (the last write token a reader saw), floor included
--         {2, counter} already ours (a retry; a write: or an earlier attempt's of our
--                      call, §2.1, ours now): lease refreshed
--         {0, pttl}    a writer holds it (or, for a write, readers do): ms to wait (a
--                      write: or a later attempt of our call, and this one came late)
--         {3, ahead}   not our turn: a writer waits ahead (read), or someone (write)
--         {-1, 0}      no node marker: amnesiac node, refuses
--         {-4, format} the marker names another format (see ACQUIRE): refuses
""" + LINE_FUNCTIONS + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + _READERS_FUNCTIONS + """
local format = node_format(KEYS[1], CLIENT_RUN)
if format == 0 then
    return {-1, 0}
elseif format ~= 1 then
    return {-4, format}
end
local now = now_ms()
local me = waiter_of(ARGV[2])
local reader = me .. attempt_of(ARGV[2])
local ttl = tonumber(ARGV[3])
local writer = redis.call('GET', KEYS[3])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local queued = redis.call('EXISTS', KEYS[5]) == 1
if queued then
    drop_lapsed(KEYS[5], KEYS[6], now)
end
local function wait_in_line()
    if ARGV[5] ~= '' then
        enter_line(KEYS[5], KEYS[6], me, ARGV[5], now + tonumber(ARGV[6]), now)
    end
end
if ARGV[1] == 'w' then
    local ours = kin(writer, ARGV[2])
    if ours == 1 then
        redis.call('SET', KEYS[3], ARGV[2], 'PX', ttl)
""" + raise_horizon("HORIZON_KEY", "ttl") + """
        return {2, settle(KEYS[2], ARGV[7], 0, 0)}
    elseif ours == -1 then  -- came late: changes nothing (§2.1)
        return {0, redis.call('PTTL', KEYS[3])}
    end
    if writer then
        wait_in_line()
        return {0, redis.call('PTTL', KEYS[3])}
    end
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
    if last then
        wait_in_line()
        return {0, tonumber(last) - now}
    end
    local first = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
    if first and first ~= me then
        wait_in_line()
        return {3, redis.call('ZRANK', KEYS[5], me) or redis.call('ZCARD', KEYS[5])}
    end
    if first then
        -- First in line, granted: keep the place until the release, as a mutex waiter
        -- does (§6.3), cut to the key's TTL.
        keep_until(KEYS[5], KEYS[6], me, now + math.min(tonumber(ARGV[6]), ttl), now)
    end
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ttl)
""" + raise_horizon("HORIZON_KEY", "ttl") + """
    return {1, settle(KEYS[2], ARGV[7], tonumber(ARGV[4]), 1)}
end
local mine = redis.call('ZSCORE', KEYS[4], reader)
if mine then
    redis.call('ZADD', KEYS[4], now + ttl, reader)
    keep_readers(KEYS[4], now)
""" + raise_horizon("HORIZON_KEY", "ttl") + """
    return {2, settle(KEYS[2], ARGV[7], 0, 0)}
end
if writer then
    wait_in_line()
    return {0, redis.call('PTTL', KEYS[3])}
end
-- A writer waiting ahead of us (any writer, for a single try) goes first.
local bound = '+inf'
if ARGV[5] ~= '' then
    bound = '(' .. ARGV[5]
end
local ahead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', bound, 'WITHSCORES')
for i = 2, #ahead, 2 do
    if tonumber(ahead[i]) % 2 == 1 then
        wait_in_line()
        return {3, #ahead / 2}
    end
end
redis.call('ZADD', KEYS[4], now + ttl, reader)
keep_readers(KEYS[4], now)
""" + raise_horizon("HORIZON_KEY", "ttl") + """
if ARGV[5] ~= '' and redis.call('ZREM', KEYS[5], me) == 1 then
    redis.call('ZREM', KEYS[6], me)
    -- The next in line, if a reader, may go too: wake it.
    local following = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
    if following[1] and tonumber(following[2]) % 2 == 0 then
        redis.pcall('PUBLISH', KEYS[7], following[1])
    end
end
return {1, settle(KEYS[2], ARGV[7], tonumber(ARGV[4]), 0)}
""",
)

READ_EXTEND = guarded(
    "read_extend",
    """
-- KEYS[1] the readers
-- ARGV[1] lock value, ARGV[2] new ttl in ms
-- returns 1 when our read was still live and its lease was reset, else 0
""" + LINE_FUNCTIONS + VALUE_FUNCTIONS + _READERS_FUNCTIONS + """
local now = now_ms()
local reader = waiter_of(ARGV[1]) .. attempt_of(ARGV[1])
local score = redis.call('ZSCORE', KEYS[1], reader)
if not score or tonumber(score) <= now then
    return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), reader)
keep_readers(KEYS[1], now)
""" + raise_horizon("HORIZON_KEY", "ARGV[2]") + """
return 1
""",
)

READ_WRITE_BACK = guarded(
    "read_write_back",
    """
-- KEYS[1] the readers, KEYS[2] node fence counters, KEYS[3] node marker
-- ARGV[1] lock value, ARGV[2] token, ARGV[3] the name's bucket
-- returns 1 when our read is live on the node and its counter is now >= token, else 0
-- (also where the marker is missing or of another format: not counted)
""" + LINE_FUNCTIONS + TOKEN_FUNCTIONS + VALUE_FUNCTIONS + """
if node_format(KEYS[3], CLIENT_RUN) ~= 1 then
    return 0
end
local reader = waiter_of(ARGV[1]) .. attempt_of(ARGV[1])
local score = redis.call('ZSCORE', KEYS[1], reader)
if not score or tonumber(score) <= now_ms() then
    return 0
end
settle(KEYS[2], ARGV[3], tonumber(ARGV[2]), 0)
return 1
""",
)

READ_RELEASE = Script(
    "read_release",
    """
-- KEYS[1] the readers, KEYS[2] the release channel, KEYS[3] the line, KEYS[4] deadlines
-- ARGV[1] lock value (its attempt's read goes, §2.1), ARGV[2] '1': also leave the line
-- ARGV[3] patience in ms, ARGV[4] the reader's score in line: a failed attempt's release
-- (ARGV[2] '0') puts its place back where the grant took it
-- returns 1 when our read was there and is gone, 0 when it was not
-- When the last reader left, publishes the waiter id of the first in line ('' if none).
""" + LINE_FUNCTIONS + VALUE_FUNCTIONS + """
local me = waiter_of(ARGV[1])
local now = now_ms()
local released = redis.call('ZREM', KEYS[1], me .. attempt_of(ARGV[1]))
if ARGV[2] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('ZREM', KEYS[3], me)
    redis.call('ZREM', KEYS[4], me)
end
if released == 1 and ARGV[2] == '0' and ARGV[4] and ARGV[4] ~= '' then
    -- Its place back in line (docs/design.md §12.2, §12.3), as a permit's.
    enter_line(KEYS[3], KEYS[4], me, ARGV[4], now + tonumber(ARGV[3]), now)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if released == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
    wake_first(KEYS[3], KEYS[4], KEYS[2], now, ARGV[2] == '0' and me or nil)
end
return released
""",
)

RW_INSPECT = Script(
    "rw_inspect",
    """
-- KEYS[1] the writer's key, KEYS[2] the readers
-- returns {writer pttl, writer holder, reader holder, ms left, ...}: the writer's PTTL
-- (-2 none) and the first 12 hex digits of its waiter id (SHA1 of the lock value's call
-- part, '' none), then each live reader's (the first 12 hex digits of its id: the same)
-- and lease left; writes nothing
""" + LINE_FUNCTIONS + VALUE_FUNCTIONS + """
local now = now_ms()
local value = redis.call('GET', KEYS[1])
local reply = {redis.call('PTTL', KEYS[1]), ''}
if value then
    reply[2] = holder_id(value)
end
local readers = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #readers, 2 do
    reply[#reply + 1] = string.sub(readers[i], 1, 12)
    reply[#reply + 1] = tonumber(readers[i + 1]) - now
end
return reply
""",
)
