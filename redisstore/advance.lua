-- pgryw redisstore: atomic max-merge of a read-your-writes token.
--
-- KEYS[1]  the key
-- ARGV[1]  the token: 1.<sysid>.<timeline>.<lsn>[.<signature>], numbers in
--          canonical lower-case hex (no leading zeros, at most 16/8/16
--          digits), signature 22 unpadded base64url characters
-- ARGV[2]  TTL in milliseconds (positive integer)
--
-- Keeps the later position (pgryw's token.Max with the stored token first):
-- same system and timeline, the larger LSN (the stored one on a tie); same
-- system, the later timeline; another system, the new token. The zero token
-- 1.0.0.0 is "no position". A stored value that is not a token is replaced.
-- Sets the TTL every time, never shortening it: the key expires ARGV[2] ms
-- from now or later if an earlier advance asked for longer. Returns the
-- token the key holds afterwards.

local function canonical(h, max)
  return #h >= 1 and #h <= max and (h == '0' or string.sub(h, 1, 1) ~= '0')
end

local function parse(s)
  if type(s) ~= 'string' or #s > 67 then
    return nil
  end
  local sys, tli, lsn, rest = string.match(s, '^1%.([0-9a-f]+)%.([0-9a-f]+)%.([0-9a-f]+)(.*)$')
  if not sys then
    return nil
  end
  if not (canonical(sys, 16) and canonical(tli, 8) and canonical(lsn, 16)) then
    return nil
  end
  if rest ~= '' then
    local sig = string.match(rest, '^%.([0-9A-Za-z_%-]+)$')
    -- 22 characters encode 16 bytes; the last one's two low bits are unused
    -- and must be zero.
    if not sig or #sig ~= 22 or not string.find('AEIMQUYcgkosw048', string.sub(sig, 22, 22), 1, true) then
      return nil
    end
  end
  return { sys = sys, tli = tli, lsn = lsn }
end

local function zero(t)
  return t.sys == '0' and t.tli == '0' and t.lsn == '0'
end

-- less compares canonical hex numbers: by length, then byte by byte (not
-- with Lua's <, which follows the server's collation locale).
local function less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return false
end

local new = parse(ARGV[1])
if not new then
  return redis.error_reply('ERR redisstore: malformed token')
end
local ttl = ARGV[2]
if type(ttl) ~= 'string' or not string.match(ttl, '^[1-9][0-9]*$') or #ttl > 13 then
  return redis.error_reply('ERR redisstore: ttl must be a positive number of milliseconds')
end

local stored = redis.call('GET', KEYS[1])
-- longer: the key's remaining TTL exceeds ttl (PTTL is -1 without a TTL
-- and -2 without the key), so it is left as it is.
local longer = redis.call('PTTL', KEYS[1]) > tonumber(ttl)
local keep = false
if stored then
  local cur = parse(stored)
  if cur == nil or zero(cur) then
    keep = false
  elseif zero(new) then
    keep = true
  elseif cur.sys ~= new.sys then
    keep = false
  elseif cur.tli ~= new.tli then
    keep = less(new.tli, cur.tli)
  else
    keep = not less(cur.lsn, new.lsn)
  end
end

if keep then
  if not longer then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return stored
end
if longer then
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
end
return ARGV[1]
