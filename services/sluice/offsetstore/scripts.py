"""The Lua scripts behind every write of the offset store.

Each request is one script call, so Redis applies it atomically: a fencing
check and the write it guards cannot be separated by a coordinator update.
Offsets and epochs travel as canonical decimal strings (no sign, no leading
zeros; the service validates them) and are compared by length then bytes,
which is exact for all of int64 where Lua's doubles are not.

Result codes are the wire ``ErrorCode`` values, substituted at import time.
"""

from __future__ import annotations

from sluice.v1 import common_pb2

_GREATER = """
-- a > b for canonical non-negative decimal strings, exact beyond 2^53.
local function greater(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
"""

# KEYS[1] members hash, then three keys per track: the offsets hash to write
#   (the track's, or the member's in broadcasting mode), the track's member
#   index set (used in broadcasting mode only) and the track's owners hash.
# ARGV[1] mode ("group" | "member"), ARGV[2] member_id, ARGV[3] member_epoch,
#   then triples (index into KEYS of the target hash, "topic/partition", offset).
# Returns {current member epoch or "", then per entry: code, stored offset or
#   "-1", owner or ""}.
COMMIT = (
    _GREATER
    + f"""
local mode, member, epoch = ARGV[1], ARGV[2], ARGV[3]
local current = redis.call('HGET', KEYS[1], member)
local member_code = {common_pb2.NONE}
if not current then
  member_code = {common_pb2.UNKNOWN_MEMBER}
elseif tonumber(current) ~= tonumber(epoch) then
  member_code = {common_pb2.STALE_MEMBER_EPOCH}
end
local out = {{current or ''}}
for i = 4, #ARGV, 3 do
  local k = tonumber(ARGV[i])
  local field, offset = ARGV[i + 1], ARGV[i + 2]
  local code, owner = member_code, false
  if code == {common_pb2.NONE} and mode == 'group' then
    owner = redis.call('HGET', KEYS[k + 2], field)
    if owner ~= member then code = {common_pb2.NOT_OWNER} end
  end
  local stored = redis.call('HGET', KEYS[k], field)
  if code == {common_pb2.NONE} then
    if (not stored) or greater(offset, stored) then
      redis.call('HSET', KEYS[k], field, offset)
      stored = offset
    end
    if mode == 'member' then redis.call('SADD', KEYS[k + 1], member) end
  end
  out[#out + 1] = code
  out[#out + 1] = stored or '-1'
  out[#out + 1] = owner or ''
end
return out
"""
)

# KEYS[1] live-member count, KEYS[2] the track's offsets hash, KEYS[3] the
#   track's member index set.
# ARGV[1] prefix of per-member offset hashes, then pairs ("topic/partition", offset).
# Returns {0} when written, {GROUP_NOT_EMPTY, live count} when refused.
# Broadcasting members' own offsets for these partitions are removed so that
# every member restarts from the reset position (the per-member hashes share
# the group's hash tag, so deriving their names here stays in one slot).
RESET = f"""
local live = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if live > 0 then return {{{common_pb2.GROUP_NOT_EMPTY}, live}} end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
for _, m in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local mk = ARGV[1] .. m
  for i = 2, #ARGV, 2 do redis.call('HDEL', mk, ARGV[i]) end
  if redis.call('EXISTS', mk) == 0 then redis.call('SREM', KEYS[3], m) end
end
return {{0, 0}}
"""

# KEYS: pairs (cursor key, cursor epoch key); ARGV: pairs (owner epoch, blob).
# A writer whose epoch is below the stored one is fenced; an equal or newer
# epoch writes (a newer one takes the cursor over). Returns per cursor "" when
# written or the stored epoch that fenced it.
SAVE_CURSORS = (
    _GREATER
    + """
local out = {}
for i = 1, #KEYS, 2 do
  local epoch = ARGV[i]
  local stored = redis.call('GET', KEYS[i + 1])
  if stored and greater(stored, epoch) then
    out[#out + 1] = stored
  else
    if stored ~= epoch then redis.call('SET', KEYS[i + 1], epoch) end
    redis.call('SET', KEYS[i], ARGV[i + 1])
    out[#out + 1] = ''
  end
end
return out
"""
)
