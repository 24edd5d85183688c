"""Lua scripts of node identity and repair (docs/design.md §4): the node marker, its format and
run-id stamp, amnesia episodes, re-seeding; conventions as in :mod:`redlock._scripts.lock`. Every
marker written begins with :data:`FORMAT` (``format=1 run_id=<server run> <what wrote it>``); a
marker of another format (§4.1) is neither re-stamped nor removed here."""

from __future__ import annotations

from redlock._scripts.script import Script

#: The slack of a node's lease horizon (docs/design.md §4.3.1), ms: the horizon key moves
#: only when a lease's expiry passes it by more, so every live lease expires within
#: ``PTTL(horizon) + HORIZON_SLACK_MS`` (no key: within the slack).
HORIZON_SLACK_MS = 250

#: The node format this release reads and writes (docs/design.md §4.1). A release that
#: changes what a node holds (its keys, the counters' layout, the marker) bumps it.
FORMAT = 1
#: How every marker of this format begins.
FORMAT_PREFIX = f"format={FORMAT} "

#: The run of the server a script runs on (its INFO's ``run_id``; 'unknown' for a user who
#: may not run INFO, which turns restart detection off for that node, §4.9).
SERVER_RUN = """
local function server_run()
    local info = redis.pcall('INFO', 'server')
    return type(info) == 'string' and string.match(info, 'run_id:(%x+)') or 'unknown'
end
"""

# Marker lookups and stamps, shared by the scripts below.
_MARKER_FUNCTIONS = SERVER_RUN + f"""
-- A marker of this format (a newer release's is not this client's to change).
local function ours(value)
    return string.sub(value, 1, {len(FORMAT_PREFIX)}) == '{FORMAT_PREFIX}'
end
-- The marker this server writes: this format, stamped with its run id.
local function stamped(run_id, text)
    return '{FORMAT_PREFIX}run_id=' .. run_id .. ' ' .. text
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

#: A lone cluster node's hash slot counts in ranges of this many tokens per epoch of the
#: master serving it (docs/design.md §11.4, "the epoch floor"); epochs from this one on
#: would reach 2**53 and are refused.
EPOCH_RANGE = 2**40
EPOCH_LIMIT = 2**53 // EPOCH_RANGE - 1
# Replies of SEED_EPOCH (first item).
EPOCH_SEEDED = 1
EPOCH_GUARD_GONE = 0
EPOCH_NOT_ABOVE = -1  # the master's epoch is not above the one recorded
EPOCH_OVERFLOW = -2  # the counter is already in the new epoch's range

SEED_EPOCH = Script(
    "seed_epoch",
    f"""
-- KEYS[1] repair guard key, KEYS[2] a cluster hash slot's fence counters (hash: '0' the
-- counter, 'epoch' the master epoch it was last seeded under)
-- ARGV[1] repair id
-- returns {{1, epoch, counter}}   seeded: counter = max(counter, epoch * {EPOCH_RANGE})
--         {{0, 0, 0}}             the guard is gone (the node restarted mid-repair)
--         {{-1, epoch, recorded}} this master's epoch is not above the one recorded (no
--                               failover since: the slot cannot be re-seeded), or past
--                               the last range
--         {{-2, epoch, counter}}  the counter is already in this epoch's range
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return {{0, 0, 0}}
end
local info = redis.call('CLUSTER', 'INFO')
local epoch = tonumber(string.match(info, 'cluster_my_epoch:(%d+)')) or 0
local recorded = tonumber(redis.call('HGET', KEYS[2], 'epoch') or '0')
if epoch <= recorded or epoch > {EPOCH_LIMIT} then
    return {{-1, epoch, recorded}}
end
local floor = epoch * {EPOCH_RANGE}
local counter = tonumber(redis.call('HGET', KEYS[2], '0') or '0')
if counter >= floor then
    return {{-2, epoch, counter}}
end
redis.call('HINCRBY', KEYS[2], '0', floor - counter)
redis.call('HSET', KEYS[2], 'epoch', epoch)
return {{1, epoch, floor}}
""",
)

FINISH_REPAIR = Script(
    "finish_repair",
    """
-- KEYS[1] repair guard key, KEYS[2] node marker key, KEYS[3] amnesia episode key
-- ARGV[1] repair id, ARGV[2] marker text, ARGV[3] '1': only once the episode's rejoin
-- time has come, '0': forced (no episode needed)
-- returns 1   the marker was written (this format, stamped with this server's run id),
--             the episode closed
--         0   the guard is gone (the node lost its data again, or restarted, mid-repair)
--         -1  not yet: no episode of this server run, or its rejoin time (docs/design.md
--             §4.3.1) has not come by this node's clock (a new data loss restarts it)
""" + _MARKER_FUNCTIONS + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local run_id = server_run()
if ARGV[3] ~= '0' then
    local episode = redis.call('GET', KEYS[3])
    if not episode then
        return -1
    end
    local _, rid, until_ms = string.match(episode, '^(%d+) (%S+) (%d+)')
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if rid ~= run_id or now < tonumber(until_ms) then
        return -1
    end
end
redis.call('SET', KEYS[2], stamped(run_id, ARGV[2]))
redis.call('DEL', KEYS[1], KEYS[3])
return 1
""",
)

# -- node identity: restarts and data loss (docs/design.md §4.4, §4.3.1) ---------------
#
# The marker is stamped with the server's run id (from INFO; 'unknown' for a user who may not
# run it, which turns restart detection off for that node). A restarted node is re-stamped
# (durable) or demoted into an amnesia episode, recorded on the node by its own clock.

IDENTIFY = Script(
    "identify",
    """
-- KEYS[1] node marker key
-- returns {run_id, marker value or nil}: the running server, and the marker (its format,
-- and the server run that stamped it)
""" + _MARKER_FUNCTIONS + """
return {server_run(), redis.call('GET', KEYS[1])}
""",
)

SERVER_IDENTITY = Script(
    "server_identity",
    """
-- returns {run_id, false}: the running server (IDENTIFY's reply without a marker: a cluster
-- master's connection, whose hash slots each have their own, docs/proposals/cluster.md P3.1a)
""" + SERVER_RUN + """
return {server_run(), false}
""",
)

INIT_MARKER = Script(
    "init_marker",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key
-- ARGV[1] marker text
-- returns 1   the marker was written (this format, stamped with this server's run id)
--         0   the node has one already (another client initialised it meanwhile; its
--             format is IDENTIFY's to tell)
--         -1  the node has an amnesia episode: it lost data, only a repair may give its
--             marker back
""" + _MARKER_FUNCTIONS + """
if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
    return -1
end
redis.call('SET', KEYS[1], stamped(server_run(), ARGV[1]))
return 1
""",
)

RESTAMP = Script(
    "restamp",
    """
-- KEYS[1] node marker key
-- ARGV[1] the marker value the client judged, ARGV[2] marker text, ARGV[3] the run id of
-- the server the client judged
-- returns 1 when re-stamped with this server's run id, 0 when the marker changed
-- meanwhile, is of another format (not this client's to change), or another server
-- answers now (a restart or a failover since it was judged)
""" + _MARKER_FUNCTIONS + """
local found = redis.call('GET', KEYS[1])
if found ~= ARGV[1] or not ours(found) then
    return 0
end
local run_id = server_run()
if run_id ~= ARGV[3] then
    return 0
end
redis.call('SET', KEYS[1], stamped(run_id, ARGV[2]))
return 1
""",
)

DEMOTE = Script(
    "demote",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key
-- ARGV[1] the marker value the client judged, ARGV[2] why, ARGV[3] how long the node
-- stays out, ms from now (docs/design.md §4.3.1)
-- returns {1, now, until} when the marker was removed and an episode begun now (ms by
-- this node's clock), {0} when the marker changed meanwhile or is of another format (not this
-- client's to remove). A node without its marker refuses every acquire until repaired.
""" + _MARKER_FUNCTIONS + """
local found = redis.call('GET', KEYS[1])
if found ~= ARGV[1] or not ours(found) then
    return {0}
end
local run_id = server_run()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now + tonumber(ARGV[3])
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], now .. ' ' .. run_id .. ' ' .. until_ms .. ' ' .. ARGV[2])
return {1, now, until_ms}
""",
)

OPEN_EPISODE = Script(
    "open_episode",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key
-- ARGV[1] why, ARGV[2] how long the node stays out, ms from now (docs/design.md
-- §4.3.1): an episode of this server run keeps the earlier of its rejoin time and this
-- returns {0, marker}            the node has its marker again (another client repaired
--                                it): nothing to do; the marker says in which format
--         {1, since, now, until} its episode (ms by this node's clock): kept if it began
--                                in this server run, else begun now (restarted since:
--                                its data may be older than the episode says); it may
--                                rejoin from `until` on
""" + _MARKER_FUNCTIONS + """
local marker = redis.call('GET', KEYS[1])
if marker then
    return {0, marker}
end
local run_id = server_run()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now + tonumber(ARGV[2])
local episode = redis.call('GET', KEYS[2])
if episode then
    local since, rid, was, why = string.match(episode, '^(%d+) (%S+) (%d+) (.*)$')
    if rid == run_id then
        if tonumber(was) <= until_ms then
            return {1, tonumber(since), now, tonumber(was)}
        end
        redis.call('SET', KEYS[2], since .. ' ' .. rid .. ' ' .. until_ms .. ' ' .. why)
        return {1, tonumber(since), now, until_ms}
    end
end
redis.call('SET', KEYS[2], now .. ' ' .. run_id .. ' ' .. until_ms .. ' ' .. ARGV[1])
return {1, now, now, until_ms}
""",
)

HORIZON = Script(
    "horizon",
    """
-- KEYS[1] node marker key, KEYS[2] amnesia episode key, KEYS[3] the node's lease horizon
-- returns {run_id, marker or nil, horizon, episode}: the running server and its marker
-- (is it healthy: this format, stamped by this run?), how long until every lease it
-- granted or extended has expired (ms by its clock: its horizon key's PTTL plus the
-- slack, docs/design.md §4.3.1), and, if it is itself in an amnesia episode of this
-- run, how long until it may rejoin (ms; -1: no such episode)
""" + _MARKER_FUNCTIONS + """
local run_id = server_run()
local left = redis.call('PTTL', KEYS[3])
if left < 0 then
    left = 0
end
local episode = redis.call('GET', KEYS[2])
local rejoin = -1
if episode then
    local _, rid, until_ms = string.match(episode, '^(%d+) (%S+) (%d+)')
    if rid == run_id then
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        rejoin = math.max(0, tonumber(until_ms) - now)
    end
end
return {run_id, redis.call('GET', KEYS[1]), left + """ + str(HORIZON_SLACK_MS) + """, rejoin}
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
-- episode key, KEYS[4] repair claim key, KEYS[5] the node's membership record
-- ARGV[1] marker text, ARGV[2] the change's joint epoch, ARGV[3..] bucket, seed, ...
-- returns 1   seeded: counters = max(counter, seed); the marker written if it had none
--             (this format, stamped with this server's run id; its episode and repair
--             claim then go)
--         0   the node's record is not the change's (it is not being added by it)
--         -1  the node's marker is of another format: nothing changed
-- A node being added holds nothing any configuration counts (docs/design.md §13.3).
""" + _MARKER_FUNCTIONS + """
if redis.call('HGET', KEYS[5], 'epoch') ~= ARGV[2] then
    return 0
end
local marker = redis.call('GET', KEYS[2])
if marker and not ours(marker) then
    return -1
end
for i = 3, #ARGV, 2 do
    local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
    local seed = tonumber(ARGV[i + 1])
    if seed > current then
        redis.call('HINCRBY', KEYS[1], ARGV[i], seed - current)
    end
end
if not marker then
    redis.call('SET', KEYS[2], stamped(server_run(), ARGV[1]))
    redis.call('DEL', KEYS[3], KEYS[4])
end
return 1
""",
)
