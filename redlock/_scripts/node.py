"""Lua scripts of node identity and repair (docs/design.md §4): the node marker, its
run-id stamp, amnesia episodes, re-seeding, and the upgrade from the previous format
(§3.8). The lock scripts are in :mod:`redlock._scripts.lock`; the same conventions hold
(a header per script naming its KEYS, ARGV and replies).

A node has this format's marker (``ns:node:marker``) or the previous format's
(``ns:node-marker``, whose clients still use the node); the scripts accept either as
"the marker". Wherever this format's marker is written, the previous format's episode
and repair-claim keys are set too, for good (the *barrier*): a client of that format
then takes the node for one that lost its data and can neither initialise nor repair
it, so it never again counts on the per-resource counters this format removes.
"""

from __future__ import annotations

from redlock._scripts.script import Script

# The barrier's values: the previous format's episode key (its clients read "since 0,
# another server run": a lost node, never repairable by them; its INIT_MARKER refuses)
# and its repair claim (held for good: their repair never starts).
BARRIER_EPISODE = ("0 format-2 this node keeps a fixed set of fence counters: clients of"
                   " the previous format (a counter per resource) are refused here")
BARRIER_CLAIM = "format-2: clients of the previous format may not repair this node"

# Marker lookups and the barrier, shared by the scripts below.
_MARKER_FUNCTIONS = """
local function marker_of(marker, legacy_marker)
    return redis.call('GET', marker) or redis.call('GET', legacy_marker)
end
local function marked(marker, legacy_marker)
    return redis.call('EXISTS', marker, legacy_marker) > 0
end
local function bar_previous_format(episode, claim)
    redis.call('SET', episode, '""" + BARRIER_EPISODE + """')
    redis.call('SET', claim, '""" + BARRIER_CLAIM + """')
end
local function server_run()
    local info = redis.pcall('INFO', 'server')
    return type(info) == 'string' and string.match(info, 'run_id:(%x+)') or 'unknown'
end
"""

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
-- KEYS[1] repair guard key, KEYS[2] the node's fence counters (hash)
-- ARGV[1] repair id, ARGV[2..] bucket, seed, bucket, seed, ...: per bucket the highest
-- counter read from a majority
-- returns 1 when seeded, 0 when the guard is gone (the node restarted mid-repair)
-- Counters only ever go up: counter = max(counter, seed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
for i = 2, #ARGV, 2 do
    local current = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
    local seed = tonumber(ARGV[i + 1])
    if seed > current then
        redis.call('HINCRBY', KEYS[2], ARGV[i], seed - current)
    end
end
return 1
""",
)

FINISH_REPAIR = Script(
    "finish_repair",
    """
-- KEYS[1] repair guard key, KEYS[2] node marker key, KEYS[3] amnesia episode key,
-- KEYS[4] KEYS[5] the barrier: the previous format's episode and repair-claim keys
-- ARGV[1] repair id, ARGV[2] marker text, ARGV[3] rejoin delay in ms (0: forced)
-- returns 1   the marker was written (stamped with this server's run id), the episode closed
--         0   the guard is gone (the node lost its data again, or restarted, mid-repair)
--         -1  not yet: no episode of this server run, or it began less than the delay ago
--             by this node's clock (a new data loss restarts the wait)
""" + _MARKER_FUNCTIONS + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local run_id = server_run()
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
bar_previous_format(KEYS[4], KEYS[5])
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
-- KEYS[1] node marker key, KEYS[2] the previous format's marker
-- returns {run_id, marker value or nil}: the running server, and what stamped the marker
-- (this format's marker, else the previous format's)
""" + _MARKER_FUNCTIONS + """
return {server_run(), marker_of(KEYS[1], KEYS[2])}
""",
)

INIT_MARKER = Script(
    "init_marker",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key, KEYS[3] the previous
-- format's marker, KEYS[4] KEYS[5] the barrier (the previous format's episode and
-- repair-claim keys)
-- ARGV[1] marker text
-- returns 1   the marker was written (and the barrier)
--         0   the node has one already (another client initialised it meanwhile)
--         -1  the node has an amnesia episode (of either format; the barrier is none): it
--             lost data, only a repair may give its marker back
""" + _MARKER_FUNCTIONS + """
if marked(KEYS[1], KEYS[3]) then
    return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
    return -1
end
local previous = redis.call('GET', KEYS[4])
if previous and previous ~= '""" + BARRIER_EPISODE + """' then
    return -1
end
redis.call('SET', KEYS[1], 'run_id=' .. server_run() .. ' ' .. ARGV[1])
bar_previous_format(KEYS[4], KEYS[5])
return 1
""",
)

RESTAMP = Script(
    "restamp",
    """
-- KEYS[1] node marker key, KEYS[2] the previous format's marker
-- ARGV[1] the marker value the client judged, ARGV[2] marker text, ARGV[3] the run id of
-- the server the client judged
-- returns 1 when re-stamped with this server's run id (in the key it was found in), 0
-- when the marker changed meanwhile or another server answers now (a restart or a
-- failover since it was judged)
""" + _MARKER_FUNCTIONS + """
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
    key = KEYS[2]
end
if redis.call('GET', key) ~= ARGV[1] then
    return 0
end
local run_id = server_run()
if run_id ~= ARGV[3] then
    return 0
end
redis.call('SET', key, 'run_id=' .. run_id .. ' ' .. ARGV[2])
return 1
""",
)

DEMOTE = Script(
    "demote",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key, KEYS[3] the previous format's
-- marker
-- ARGV[1] the marker value the client judged, ARGV[2] why
-- returns 1 when the marker was removed (of either format) and an episode begun now, 0
-- when the marker changed meanwhile. A node without its marker refuses every acquire
-- until repaired; it comes back in this format.
""" + _MARKER_FUNCTIONS + """
if marker_of(KEYS[1], KEYS[3]) ~= ARGV[1] then
    return 0
end
local run_id = server_run()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('SET', KEYS[2], now .. ' ' .. run_id .. ' ' .. ARGV[2])
return 1
""",
)

OPEN_EPISODE = Script(
    "open_episode",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key, KEYS[3] the previous format's
-- marker
-- ARGV[1] why
-- returns {0}             the node has its marker (of either format): nothing to do
--         {1, since, now} its episode (ms by this node's clock): kept if it began in this
--                         server run, else begun now (restarted since: its data may be
--                         older than the episode says)
""" + _MARKER_FUNCTIONS + """
if marked(KEYS[1], KEYS[3]) then
    return {0}
end
local run_id = server_run()
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

# -- the upgrade from the previous format (docs/design.md §3.8) -------------------------

UPGRADE_NODE = Script(
    "upgrade_node",
    """
-- KEYS[1] node marker key, KEYS[2] the previous format's marker, KEYS[3] KEYS[4] the
-- barrier (the previous format's episode and repair-claim keys)
-- returns 1 upgraded now: its marker moved to this format's key, the barrier set
--         2 in this format already (the barrier is set again)
--         0 no marker at all: it lost its data; it comes back in this format by repair
""" + _MARKER_FUNCTIONS + """
local previous = redis.call('GET', KEYS[2])
if previous then
    if redis.call('EXISTS', KEYS[1]) == 0 then
        redis.call('SET', KEYS[1], previous)
    end
    redis.call('DEL', KEYS[2])
    bar_previous_format(KEYS[3], KEYS[4])
    return 1
end
if redis.call('EXISTS', KEYS[1]) == 1 then
    bar_previous_format(KEYS[3], KEYS[4])
    return 2
end
return 0
""",
)

FOLD_COUNTERS = Script(
    "fold_counters",
    """
-- KEYS[1] the node's fence counters (hash), KEYS[2] the previous format's marker,
-- KEYS[3..n] per-resource counters of the previous format
-- ARGV[1..n-2] each one's bucket (its resource's field in KEYS[1], same order)
-- returns the number of counters folded into their buckets and removed, or -1 when the
-- previous format's marker is there (its clients still read them: nothing changes)
if redis.call('EXISTS', KEYS[2]) == 1 then
    return -1
end
local folded = 0
for i = 3, #KEYS do
    local value = redis.call('GET', KEYS[i])
    if value then
        local bucket = ARGV[i - 2]
        local counter = tonumber(redis.call('HGET', KEYS[1], bucket) or '0')
        if tonumber(value) > counter then
            redis.call('HINCRBY', KEYS[1], bucket, tonumber(value) - counter)
        end
        redis.call('DEL', KEYS[i])
        folded = folded + 1
    end
end
return folded
""",
)

# -- membership changes (docs/design.md §13.3) --------------------------------------------

# Replies of WRITE_MEMBERS (first element).
MEMBERS_WRITTEN = 1  # {1}: written, or the same record was there
MEMBERS_NEWER = 0  # {0, epoch, members, joining, retired}: a higher epoch (or another
# record of the same epoch) is there: nothing written

WRITE_MEMBERS = Script(
    "write_members",
    """
-- KEYS[1] the node's membership record (hash)
-- ARGV[1] epoch, ARGV[2] members, ARGV[3] joining ('' for a stable configuration),
-- ARGV[4] retired ('1' on a node the change removes, else '')
-- returns {1} written (the stored epoch was lower), or this very record was there
--         {0, epoch, members, joining, retired} what is there: a higher epoch, or the same
--         epoch with another configuration; nothing written (epochs never go down)
local record = redis.call('HMGET', KEYS[1], 'epoch', 'members', 'joining', 'retired')
local epoch = tonumber(record[1] or '0') or 0
local wanted = tonumber(ARGV[1])
if epoch == wanted and (record[2] or '') == ARGV[2] and (record[3] or '') == ARGV[3]
        and (record[4] or '') == ARGV[4] then
    return {1}
end
if epoch >= wanted then
    return {0, epoch, record[2] or '', record[3] or '', record[4] or ''}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'members', ARGV[2])
if ARGV[3] ~= '' then
    redis.call('HSET', KEYS[1], 'joining', ARGV[3])
end
if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[1], 'retired', ARGV[4])
end
return {1}
""",
)

SEED_MEMBER = Script(
    "seed_member",
    """
-- KEYS[1] the node's fence counters (hash), KEYS[2] node marker key, KEYS[3] amnesia
-- episode key, KEYS[4] repair claim key, KEYS[5] KEYS[6] the barrier (the previous
-- format's episode and repair-claim keys), KEYS[7] the node's membership record,
-- KEYS[8] the previous format's marker
-- ARGV[1] marker text, ARGV[2] the change's joint epoch, ARGV[3..] bucket, seed, ...
-- returns 1   seeded: counters = max(counter, seed); the marker written if it had none
--             (stamped with this server's run id; its episode and repair claim then go)
--         0   the node's record is not the change's (it is not being added by it)
-- A node being added holds nothing any configuration counts (docs/design.md §13.3).
""" + _MARKER_FUNCTIONS + """
if redis.call('HGET', KEYS[7], 'epoch') ~= ARGV[2] then
    return 0
end
for i = 3, #ARGV, 2 do
    local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
    local seed = tonumber(ARGV[i + 1])
    if seed > current then
        redis.call('HINCRBY', KEYS[1], ARGV[i], seed - current)
    end
end
if not marked(KEYS[2], KEYS[8]) then
    redis.call('SET', KEYS[2], 'run_id=' .. server_run() .. ' ' .. ARGV[1])
    bar_previous_format(KEYS[5], KEYS[6])
    redis.call('DEL', KEYS[3], KEYS[4])
end
return 1
""",
)
