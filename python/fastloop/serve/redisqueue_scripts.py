"""The Lua scripts of RedisQueue (redisqueue.py says what the queue guarantees): each moves
one or many jobs between the queue's streams and their records in one atomic call, built on
RedisStore's create and finish scripts so that a record is written the same way by both.
"""

from __future__ import annotations

from .redisstore import FINISH_SCRIPT

__all__: list[str] = []  # private to redisqueue.py


# RedisStore's finish, only while the job has status ARGV[8] (0 otherwise); a job Redis lost
# is written, as RedisStore.finish does. ARGV[9] == '1' also deletes its queue entry (cancel).
_GUARD = """
local cur = redis.call('HGET', KEYS[1], 'record')
if cur then
  local ok, rec = pcall(cjson.decode, cur)
  if not ok or type(rec) ~= 'table' or rec['status'] ~= ARGV[8] then return 0 end
end
if ARGV[9] == '1' then
  local q = redis.call('HMGET', KEYS[1], 'qkey', 'qentry')
  if q[1] and q[2] then redis.call('XDEL', q[1], q[2]) end
end
"""
_FINISH_IF = _GUARD + FINISH_SCRIPT

# _FINISH_IF as a Lua function (KEYS and ARGV become its parameters), for the scripts below
# that finish several jobs in one call.
_FINISH_IF_FN = "local function finish_if(KEYS, ARGV)\n" + _FINISH_IF + "end\n"

# KEYS: the streams, highest priority first; pending; finished. ARGV: group, consumer, count,
# now, job key prefix, finished ttl, index ttl, then the entries this process holds already
# (level, entry id, job id, resume each: a blocking read's, reclaimed ones, orphans). Takes up
# to `count` new entries (after those given), from the first stream that has them on, and
# moves each one's job queued -> running (and, for an orphan, '1' in resume, running ->
# running again: its run was lost), all in one call (a worker's batch costs one round trip).
# A job past its deadline fails here instead ("deadline exceeded"). Per entry {level, entry
# id, job id, outcome, record, input}; outcome 1: started (record, input); 2: failed, late
# (its final record); 0: not started (record: its status, or ''), its entry acknowledged and
# deleted unless the job is running (another process holds it too; its owner acknowledges it).
_TAKE_START = _FINISH_IF_FN + """
local n = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local got = {}
for i = 8, #ARGV, 4 do got[#got + 1] = {tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]} end
n = n - #got
for level = 1, #KEYS - 2 do
  if n <= 0 then break end
  local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n, 'STREAMS', KEYS[level], '>')
  if read then
    for _, e in ipairs(read[1][2]) do
      got[#got + 1] = {level, e[1], e[2][2], '0'}
      n = n - 1
    end
  end
end
local out = {}
for _, g in ipairs(got) do
  local key = ARGV[5] .. g[3]
  local cur = redis.call('HGET', key, 'record')
  local ok, rec = false, nil
  if cur then ok, rec = pcall(cjson.decode, cur) end
  local status = (ok and type(rec) == 'table') and rec['status'] or ''
  local outcome, payload, input = 0, status, ''
  local startable = status == 'queued' or (status == 'running' and g[4] == '1')
  if startable and type(rec['deadline']) == 'number' and rec['deadline'] <= now then
    rec['status'] = 'failed'
    rec['finished'] = now
    if status == 'queued' then
      rec['error'] = string.format('deadline exceeded: still queued after %.3g s', now - rec['submitted'])
    else
      rec['error'] = string.format('deadline exceeded: %.3g s after submit, its run lost with a Redis restart', now - rec['submitted'])
    end
    payload = cjson.encode(rec)
    finish_if({key, KEYS[#KEYS - 1], KEYS[#KEYS]}, {g[3], payload, '', '0', ARGV[4], ARGV[6], ARGV[7], status, '0'})
    outcome = 2
  elseif startable then
    rec['status'] = 'running'
    rec['started'] = now
    payload = cjson.encode(rec)
    redis.call('HSET', key, 'record', payload)
    outcome, input = 1, redis.call('HGET', key, 'input') or ''
  end
  if outcome ~= 1 and status ~= 'running' then
    redis.call('XACK', KEYS[g[1]], ARGV[1], g[2])
    redis.call('XDEL', KEYS[g[1]], g[2])
  end
  out[#out + 1] = g[1]
  out[#out + 1] = g[2]
  out[#out + 1] = g[3]
  out[#out + 1] = outcome
  out[#out + 1] = payload
  out[#out + 1] = input
end
return out
"""

# KEYS: pending, finished. ARGV: group, then 12 per job: job key, stream, entry id, and
# _FINISH_IF's 9 arguments. Finishes each job (only while its status is the one expected)
# and acknowledges and deletes its entry, in one call. One 1 (written) or 0 per job. A job
# not written because it is queued or running again (a Redis restarted from an older
# snapshot) keeps its entry: the job still has to run, from that entry.
_FINISH_BATCH = _FINISH_IF_FN + """
local out = {}
for i = 2, #ARGV, 12 do
  local args = {}
  for j = 3, 11 do args[#args + 1] = ARGV[i + j] end
  local written = finish_if({ARGV[i], KEYS[1], KEYS[2]}, args)
  out[#out + 1] = written
  local open = false
  if written == 0 then
    local cur = redis.call('HGET', ARGV[i], 'record')
    local ok, rec = false, nil
    if cur then ok, rec = pcall(cjson.decode, cur) end
    open = ok and type(rec) == 'table' and (rec['status'] == 'queued' or rec['status'] == 'running')
  end
  if not open then
    redis.call('XACK', ARGV[i + 1], ARGV[1], ARGV[i + 2])
    redis.call('XDEL', ARGV[i + 1], ARGV[i + 2])
  end
end
return out
"""

# KEYS: deadlines, pending, finished. ARGV: now, job key prefix, finished ttl, index ttl,
# limit. Fails the queued jobs whose deadline has passed (no worker took them: all busy, or
# none running), deleting their entries; forgets the deadlines passed. Returns their ids
# and final records, flat.
_FAIL_LATE = _FINISH_IF_FN + """
local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[5]))
local out = {}
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local key = ARGV[2] .. id
  local cur = redis.call('HGET', key, 'record')
  local ok, rec = false, nil
  if cur then ok, rec = pcall(cjson.decode, cur) end
  if ok and type(rec) == 'table' and rec['status'] == 'queued' then
    rec['status'] = 'failed'
    rec['finished'] = now
    rec['error'] = string.format('deadline exceeded: still queued after %.3g s', now - rec['submitted'])
    local new = cjson.encode(rec)
    finish_if({key, KEYS[2], KEYS[3]}, {id, new, '', '0', ARGV[1], ARGV[3], ARGV[4], 'queued', '1'})
    out[#out + 1] = id
    out[#out + 1] = new
  end
end
return out
"""
