-- Palisade fenced write for Redis: compare, advance and write in one atomic script.
--
-- KEYS[1]    the lock's fence hash (field "epoch": the high-water mark, decimal)
-- KEYS[2..]  the data keys this call writes
-- ARGV[1]    the epoch of a token the caller has already verified (decimal, no sign)
-- ARGV[2]    "set" (ARGV[3..] are the values, one per data key), "del", or "fence"
--
-- Returns {1, previous_mark} when admitted, {0, high_water} when the epoch is stale.
-- Epochs are compared as decimal strings (length, then bytes) because Lua numbers are
-- doubles and lose precision past 2^53.

local function canonical(s)
  return type(s) == 'string' and (s == '0' or string.match(s, '^[1-9][0-9]*$') ~= nil)
end

local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local epoch = ARGV[1]
local op = ARGV[2]
if not canonical(epoch) or #epoch > 20 then
  return redis.error_reply('palisade: epoch argument is not a decimal integer')
end
if op == 'set' and #ARGV ~= #KEYS + 1 then
  return redis.error_reply('palisade: set needs one value per data key')
end
if op ~= 'set' and op ~= 'del' and op ~= 'fence' then
  return redis.error_reply('palisade: unknown operation')
end
-- A data key inside the fence namespace would overwrite a mark with data.
for i = 2, #KEYS do
  if string.sub(KEYS[i], 1, 15) == 'palisade:fence:' then
    return redis.error_reply('palisade: data keys may not start with palisade:fence:')
  end
end

local mark = redis.call('HGET', KEYS[1], 'epoch')
if not mark then mark = '0' end
if not canonical(mark) then
  return redis.error_reply('palisade: unreadable high-water mark in ' .. KEYS[1])
end
if less(epoch, mark) then
  return {0, mark}
end

-- Mark first: if a data write below failed half-way, a raised mark is the safe leftover
-- (it refuses old holders); data written under an unraised mark would not be.
if mark ~= epoch then
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
if op == 'set' then
  for i = 2, #KEYS do
    redis.call('SET', KEYS[i], ARGV[i + 1])
  end
elseif op == 'del' and #KEYS > 1 then
  redis.call('DEL', unpack(KEYS, 2))
end
return {1, mark}
