"""The Lua scripts behind every write of the offset store.

Each request is one script call, so Redis applies it atomically: a fencing
check and the write it guards cannot be separated by a coordinator update.
Offsets and epochs travel as canonical decimal strings (no sign, no leading
zeros; the service validates them) and are compared by length then bytes,
which is exact for all of int64 where Lua's doubles are not.

Result codes are the wire ``ErrorCode`` values, substituted at import time.
"""

from __future__ import annotations

from sluice.offsetstore import keys
from sluice.offsetstore.topic_identity import TOPIC_CHECK_LUA
from sluice.v1 import common_pb2

_GREATER = """
-- a > b for canonical non-negative decimal strings, exact beyond 2^53.
local function greater(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
"""

_TOPIC = TOPIC_CHECK_LUA

# KEYS[1] members hash, then four keys per track: the offsets hash to write
#   (the track's, or the member's in broadcasting mode), the track's member
#   index set (used in broadcasting mode only), the track's owners hash and its
#   leader-epochs hash (KIP-320; group mode only); then two keys per topic: its
#   id key and its refs hash (keys.py).
# ARGV[1] mode ("group" | "member"), ARGV[2] member_id, ARGV[3] member_epoch,
#   then 6-tuples (index into KEYS of the target hash, index into KEYS of the
#   topic's id key, "topic/partition", offset, the writer's topic_id or "", the
#   leader epoch or ""). The epoch is written with the offset it came with; an
#   offset written without one removes the epoch of an older offset.
# Returns {current member epoch or "", then per entry: code, stored offset or
#   "-1", owner (NOT_OWNER) or the topic's current id (topic refusals) or ""}.
# A written hash is registered in the topic's refs (HSETNX: a no-op after the
# first time, so not even propagated) so that deleting the topic removes it.
COMMIT = (
    _GREATER
    + _TOPIC
    + f"""
local mode, member, epoch = ARGV[1], ARGV[2], ARGV[3]
local current = redis.call('HGET', KEYS[1], member)
local member_code = {common_pb2.NONE}
if not current then
  member_code = {common_pb2.UNKNOWN_MEMBER}
elseif tonumber(current) ~= tonumber(epoch) then
  member_code = {common_pb2.STALE_MEMBER_EPOCH}
end
local ids = {{}}
local out = {{current or ''}}
for i = 4, #ARGV, 6 do
  local k, t = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local field, offset, given, leader_epoch = ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  if ids[t] == nil then ids[t] = redis.call('GET', KEYS[t]) end
  local code, detail = member_code, false
  if code == {common_pb2.NONE} then
    code = topic_code(ids[t], given)
    if code ~= {common_pb2.NONE} then detail = ids[t] end
  end
  if code == {common_pb2.NONE} and mode == 'group' then
    detail = redis.call('HGET', KEYS[k + 2], field)
    if detail ~= member then code = {common_pb2.NOT_OWNER} end
  end
  local stored = redis.call('HGET', KEYS[k], field)
  if code == {common_pb2.NONE} then
    if (not stored) or greater(offset, stored) then
      redis.call('HSET', KEYS[k], field, offset)
      stored = offset
      if mode == 'group' then
        if leader_epoch ~= '' then
          redis.call('HSET', KEYS[k + 3], field, leader_epoch)
          redis.call('HSETNX', KEYS[t + 1], KEYS[k + 3], '{keys.REF_FIELDS}')
        else
          redis.call('HDEL', KEYS[k + 3], field)
        end
      end
    end
    redis.call('HSETNX', KEYS[t + 1], KEYS[k], '{keys.REF_FIELDS}')
    if mode == 'member' then
      redis.call('SADD', KEYS[k + 1], member)
      -- the member's hash is <prefix><member_id>: the index lists ids under that prefix
      local prefix = string.sub(KEYS[k], 1, #KEYS[k] - #member)
      redis.call('HSETNX', KEYS[t + 1], KEYS[k + 1], '{keys.REF_INDEX}' .. prefix)
    end
    detail = false
  end
  out[#out + 1] = code
  out[#out + 1] = stored or '-1'
  out[#out + 1] = detail or ''
end
return out
"""
)

# KEYS[1] live-member count, KEYS[2] the track's offsets hash, KEYS[3] the
#   track's member index set, then two keys per topic reset: its id key and its
#   refs hash; last, the track's leader-epochs hash (a reset offset has no epoch).
# ARGV[1] prefix of per-member offset hashes, ARGV[2] the number of topics N,
#   then N topic_ids the reset was resolved for (aligned with the topics' KEYS;
#   "" when none), then pairs ("topic/partition", offset).
# Returns {0, ""} when written, {GROUP_NOT_EMPTY, live count} or {topic refusal
# code, the topic's current id or "", the refused topic's number (1..N)} when
# refused: every topic is checked before anything is written, so a multi-topic
# reset lands whole or not at all.
# Broadcasting members' own offsets for these partitions are removed so that
# every member restarts from the reset position (the per-member hashes share
# the group's hash tag, so deriving their names here stays in one slot).
RESET = (
    _TOPIC
    + f"""
local live = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if live > 0 then return {{{common_pb2.GROUP_NOT_EMPTY}, live}} end
local n = tonumber(ARGV[2])
for t = 1, n do
  local current = redis.call('GET', KEYS[2 + 2 * t])
  local code = topic_code(current, ARGV[2 + t])
  if code ~= {common_pb2.NONE} then return {{code, current or '', t}} end
end
local first = 3 + n
for i = first, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  redis.call('HDEL', KEYS[#KEYS], ARGV[i])
end
for t = 1, n do
  redis.call('HSETNX', KEYS[3 + 2 * t], KEYS[2], '{keys.REF_FIELDS}')
end
for _, m in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local mk = ARGV[1] .. m
  for i = first, #ARGV, 2 do redis.call('HDEL', mk, ARGV[i]) end
  if redis.call('EXISTS', mk) == 0 then redis.call('SREM', KEYS[3], m) end
end
return {{0, ''}}
"""
)

# KEYS: quadruples (cursor key, cursor epoch key, the topic's id key, the
#   topic's refs hash); ARGV: triples (owner epoch, blob, the writer's topic_id or "").
# A writer whose epoch is below the stored one is fenced; an equal or newer
# epoch writes (a newer one takes the cursor over). A writer whose topic_id is
# not the topic's current one (deleted, or deleted and re-created) writes
# nothing. Returns per cursor "" when written, "E<stored epoch>" when fenced,
# "T<code>:<the topic's current id or nothing>" when refused for the topic.
SAVE_CURSORS = (
    _GREATER
    + _TOPIC
    + f"""
local out = {{}}
local j = 1
for i = 1, #KEYS, 4 do
  local epoch, blob, given = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  j = j + 3
  local current = redis.call('GET', KEYS[i + 2])
  local code = topic_code(current, given)
  local stored = redis.call('GET', KEYS[i + 1])
  if code ~= {common_pb2.NONE} then
    out[#out + 1] = 'T' .. code .. ':' .. (current or '')
  elseif stored and greater(stored, epoch) then
    out[#out + 1] = 'E' .. stored
  else
    if stored ~= epoch then redis.call('SET', KEYS[i + 1], epoch) end
    redis.call('SET', KEYS[i], blob)
    redis.call('HSETNX', KEYS[i + 3], KEYS[i], '{keys.REF_KEY}')
    redis.call('HSETNX', KEYS[i + 3], KEYS[i + 1], '{keys.REF_KEY}')
    out[#out + 1] = ''
  end
end
return out
"""
)
