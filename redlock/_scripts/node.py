"""Lua scripts of node identity and repair (docs/design.md §4): the node marker, its
run-id stamp, amnesia episodes, re-seeding. The lock scripts are in
:mod:`redlock._scripts.lock`; the same conventions hold (a header per script naming its
KEYS, ARGV and replies).
"""

from __future__ import annotations

from redlock._scripts.script import Script

# Replies of INIT_MARKER.
INIT_WRITTEN = 1  # the marker was written
INIT_EXISTS = 0  # the node has one already
INIT_EPISODE = -1  # the node has an amnesia episode: only a repair may give its marker back
# Replies of FINISH_REPAIR.
REPAIR_WRITTEN = 1
REPAIR_GUARD_GONE = 0
REPAIR_TOO_YOUNG = -1

SEED_COUNTERS = Script(
    "seed_counters",
    """
-- KEYS[1] repair guard key, KEYS[2..n] fence counter keys
-- ARGV[1] repair id, ARGV[2..n] counter values (same order as KEYS[2..n])
-- returns 1 when seeded, 0 when the guard is gone (the node restarted mid-repair)
-- Counters only ever go up: counter = max(counter, seed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
for i = 2, #KEYS do
    local current = tonumber(redis.call('GET', KEYS[i]) or '0')
    local seed = tonumber(ARGV[i])
    if seed > current then
        redis.call('INCRBY', KEYS[i], seed - current)
    end
end
return 1
""",
)

FINISH_REPAIR = Script(
    "finish_repair",
    """
-- KEYS[1] repair guard key, KEYS[2] node marker key, KEYS[3] amnesia episode key
-- ARGV[1] repair id, ARGV[2] marker text, ARGV[3] rejoin delay in ms (0: forced)
-- returns 1   the marker was written (stamped with this server's run id), the episode closed
--         0   the guard is gone (the node lost its data again, or restarted, mid-repair)
--         -1  not yet: no episode of this server run, or it began less than the delay ago
--             by this node's clock (a new data loss restarts the wait)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local info = redis.pcall('INFO', 'server')
local run_id = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or 'unknown'
local delay = tonumber(ARGV[3])
if delay > 0 then
    local episode = redis.call('GET', KEYS[3])
    if not episode then
        return -1
    end
    local since, rid = string.match(episode, '^(%d+) (%S+)')
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if rid ~= run_id or now - tonumber(since) < delay then
        return -1
    end
end
redis.call('SET', KEYS[2], 'run_id=' .. run_id .. ' ' .. ARGV[2])
redis.call('DEL', KEYS[1], KEYS[3])
return 1
""",
)

# -- node identity: restarts and data loss (docs/design.md §4) -------------------------
#
# The node marker is stamped with the run id of the server that wrote it. A server that
# restarted (or a replica promoted in its place) has another run id: it may have come
# back with an older copy of its data, so the client checks it (IDENTIFY, on every new
# connection) and either re-stamps it (durable persistence, same server) or turns the
# restart into an amnesia episode (DEMOTE). An episode key records, by the node's own
# clock and with its run id, when this node was first seen without its marker: every
# client measures the rejoin delay from it, and a new data loss restarts it. The run id
# comes from INFO; a user who may not run it (ACL -@dangerous) gets 'unknown' there,
# which turns restart detection off for that node (the manager warns).

IDENTIFY = Script(
    "identify",
    """
-- KEYS[1] node marker key
-- returns {run_id, marker value or nil}: the running server, and what stamped the marker
local info = redis.pcall('INFO', 'server')
local run_id = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or 'unknown'
return {run_id, redis.call('GET', KEYS[1])}
""",
)

INIT_MARKER = Script(
    "init_marker",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key
-- ARGV[1] marker text
-- returns 1   the marker was written
--         0   the node has one already (another client initialised it meanwhile)
--         -1  the node has an amnesia episode: it lost data, only a repair may give its
--             marker back
if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
    return -1
end
local info = redis.pcall('INFO', 'server')
local run_id = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or 'unknown'
redis.call('SET', KEYS[1], 'run_id=' .. run_id .. ' ' .. ARGV[1])
return 1
""",
)

RESTAMP = Script(
    "restamp",
    """
-- KEYS[1] node marker key
-- ARGV[1] the marker value the client judged, ARGV[2] marker text, ARGV[3] the run id of
-- the server the client judged
-- returns 1 when re-stamped with this server's run id, 0 when the marker changed meanwhile
-- or another server answers now (a restart or a failover since it was judged)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local info = redis.pcall('INFO', 'server')
local run_id = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or 'unknown'
if run_id ~= ARGV[3] then
    return 0
end
redis.call('SET', KEYS[1], 'run_id=' .. run_id .. ' ' .. ARGV[2])
return 1
""",
)

DEMOTE = Script(
    "demote",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key
-- ARGV[1] the marker value the client judged, ARGV[2] why
-- returns 1 when the marker was removed and an episode begun now, 0 when the marker
-- changed meanwhile. A node without its marker refuses every acquire until repaired.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local info = redis.pcall('INFO', 'server')
local run_id = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or 'unknown'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], now .. ' ' .. run_id .. ' ' .. ARGV[2])
return 1
""",
)

OPEN_EPISODE = Script(
    "open_episode",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key
-- ARGV[1] why
-- returns {0}             the node has its marker: nothing to do
--         {1, since, now} its episode (ms by this node's clock): kept if it began in this
--                         server run, else begun now (restarted since: its data may be
--                         older than the episode says)
if redis.call('EXISTS', KEYS[1]) == 1 then
    return {0}
end
local info = redis.pcall('INFO', 'server')
local run_id = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or 'unknown'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local episode = redis.call('GET', KEYS[2])
if episode then
    local since, rid = string.match(episode, '^(%d+) (%S+)')
    if rid == run_id then
        return {1, tonumber(since), now}
    end
end
redis.call('SET', KEYS[2], now .. ' ' .. run_id .. ' ' .. ARGV[1])
return {1, now, now}
""",
)
