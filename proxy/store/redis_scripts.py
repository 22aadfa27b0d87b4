"""The Redis backend's Lua: one script applies a batch of store writes atomically (`APPLY`, its
arguments built by `op_args`), one reads a log in one reply (`READ_LOG`). See redis_store.py.
"""

from __future__ import annotations

from typing import Any

from proxy.store.base import (
    Append,
    Create,
    Lease,
    Op,
    Push,
    Remove,
    Signal,
    Update,
    entry_size,
)

APPLY = r"""
local p, max_bytes = ARGV[1], tonumber(ARGV[2])
local function forget(key)
  local e = p .. 'e:' .. key
  local scope, aliases = unpack(redis.call('HMGET', e, 'scope', 'aliases'))
  if scope and aliases and aliases ~= '' then
    for alias in string.gmatch(aliases, '[^\n]+') do
      local a = p .. 'a:' .. scope .. ':' .. alias
      if redis.call('GET', a) == key then redis.call('DEL', a) end
    end
  end
  redis.call('DEL', e, p .. 'l:' .. key)
  redis.call('ZREM', p .. 'created', key)
  redis.call('ZREM', p .. 'expiry', key)
  local size = tonumber(redis.call('HGET', p .. 'sizes', key) or '0')
  redis.call('HDEL', p .. 'sizes', key)
  if size ~= 0 then redis.call('DECRBY', p .. 'bytes', size) end
end
local function grow(key, n)
  redis.call('HINCRBY', p .. 'sizes', key, n)
  redis.call('INCRBY', p .. 'bytes', n)
end
local i, gone = 3, 0
while i <= #ARGV do
  local op, key = ARGV[i], ARGV[i + 1]
  local e = p .. 'e:' .. key
  if op == 'create' then
    local scope, doc, created, expires = ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
    local aliases = ARGV[i + 7]
    forget(key)
    redis.call('HSET', e, 'scope', scope, 'doc', doc, 'created', created, 'expires', expires,
               'lease', ARGV[i + 6], 'signals', '', 'aliases', aliases)
    local at = math.floor(tonumber(expires) * 1000)
    redis.call('PEXPIREAT', e, at)
    for alias in string.gmatch(aliases, '[^\n]+') do
      redis.call('SET', p .. 'a:' .. scope .. ':' .. alias, key, 'PXAT', at)
    end
    redis.call('ZADD', p .. 'created', created, key)
    redis.call('ZADD', p .. 'expiry', expires, key)
    grow(key, tonumber(ARGV[i + 8]))
    i = i + 9
  elseif op == 'update' then
    if redis.call('EXISTS', e) == 1 then
      local old = redis.call('HSTRLEN', e, 'doc')
      redis.call('HSET', e, 'doc', ARGV[i + 2])
      if ARGV[i + 3] ~= '' then redis.call('HSET', e, 'lease', ARGV[i + 3]) end
      local added = ARGV[i + 4]
      if added ~= '' then
        local scope, aliases, expires =
          unpack(redis.call('HMGET', e, 'scope', 'aliases', 'expires'))
        local at = math.floor(tonumber(expires) * 1000)
        for alias in string.gmatch(added, '[^\n]+') do
          redis.call('SET', p .. 'a:' .. scope .. ':' .. alias, key, 'PXAT', at)
        end
        if aliases ~= '' then added = aliases .. '\n' .. added end
        redis.call('HSET', e, 'aliases', added)
      end
      grow(key, #ARGV[i + 2] - old + tonumber(ARGV[i + 5]))
    end
    i = i + 6
  elseif op == 'append' then
    if redis.call('EXISTS', e) == 1 then
      local l = p .. 'l:' .. key
      local added = redis.pcall('XADD', l, (tonumber(ARGV[i + 2]) + 1) .. '-0', 'd', ARGV[i + 3])
      if type(added) ~= 'table' or not added.err then
        redis.call('PEXPIREAT', l, math.floor(tonumber(redis.call('HGET', e, 'expires')) * 1000))
        grow(key, #ARGV[i + 3])
      end
    end
    i = i + 4
  elseif op == 'push' then
    local count = tonumber(ARGV[i + 2])
    if redis.call('EXISTS', e) == 1 then
      local l = p .. 'l:' .. key
      local top = tonumber(redis.call('HGET', e, 'top') or '-1')
      local last = redis.call('XREVRANGE', l, '+', '-', 'COUNT', 1)
      if #last > 0 then
        top = math.max(top, tonumber(string.match(last[1][1], '^%d+')) - 1)
      end
      local added = 0
      for j = 1, count do
        top = top + 1
        redis.call('XADD', l, (top + 1) .. '-0', 'd', ARGV[i + 2 + j])
        added = added + #ARGV[i + 2 + j]
      end
      redis.call('HSET', e, 'top', top)
      redis.call('PEXPIREAT', l, math.floor(tonumber(redis.call('HGET', e, 'expires')) * 1000))
      grow(key, added)
    end
    i = i + 3 + count
  elseif op == 'remove' then
    local l, id = p .. 'l:' .. key, (tonumber(ARGV[i + 2]) + 1) .. '-0'
    local found = redis.call('XRANGE', l, id, id)
    if #found > 0 then
      redis.call('XDEL', l, id)
      grow(key, -#found[1][2][2])
    end
    i = i + 3
  elseif op == 'signal' then
    local raised = redis.call('HGET', e, 'signals')
    local name = ARGV[i + 2]
    if raised and not string.find(',' .. raised .. ',', ',' .. name .. ',', 1, true) then
      if raised == '' then raised = name else raised = raised .. ',' .. name end
      redis.call('HSET', e, 'signals', raised)
      redis.call('PUBLISH', p .. 'signals', key .. '\n' .. name)
    end
    i = i + 3
  elseif op == 'lease' then
    if redis.call('EXISTS', e) == 1 then redis.call('HSET', e, 'lease', ARGV[i + 2]) end
    i = i + 3
  elseif op == 'delete' then
    forget(key)
    i = i + 2
  elseif op == 'sweep' then
    for _, old in ipairs(redis.call('ZRANGEBYSCORE', p .. 'expiry', '-inf', key)) do
      forget(old)
      gone = gone + 1
    end
    i = i + 2
  else
    return redis.error_reply('unknown store op ' .. tostring(op))
  end
end
while max_bytes > 0 and tonumber(redis.call('GET', p .. 'bytes') or '0') > max_bytes do
  local oldest = redis.call('ZRANGE', p .. 'created', 0, 0)
  if #oldest == 0 then break end
  forget(oldest[1])
  gone = gone + 1
end
return gone
"""
#: `read_log` in one bulk string, `<mark> <length> <data>` after another: redis-py (without
#: hiredis) parses an XRANGE reply element by element, ~20 µs per entry — 4.3 ms (median) for
#: a conversation of 200 items, against 1.7 ms this way (BENCHMARKS.md section 9).
READ_LOG = r"""
local parts = {}
for _, row in ipairs(redis.call('XRANGE', KEYS[1], ARGV[1], '+')) do
  local data = row[2][2]
  parts[#parts + 1] = (tonumber(string.match(row[1], '^%d+')) - 1) .. ' ' .. #data .. ' ' .. data
end
return table.concat(parts)
"""


def op_args(op: Op) -> list[Any]:
    """The script arguments of one write."""
    if isinstance(op, Create):
        aliases = "\n".join(op.aliases)
        size = entry_size(op.doc, op.aliases)
        return [
            "create",
            op.key,
            op.scope,
            op.doc,
            repr(op.created),
            repr(op.expires),
            repr(op.lease),
            aliases,
            size,
        ]
    if isinstance(op, Update):
        lease = "" if op.lease is None else repr(op.lease)
        added = entry_size(b"", op.aliases)
        return ["update", op.key, op.doc, lease, "\n".join(op.aliases), added]
    if isinstance(op, Append):
        return ["append", op.key, op.mark, op.data]
    if isinstance(op, Push):
        return ["push", op.key, len(op.data), *op.data] if op.data else []
    if isinstance(op, Remove):
        return ["remove", op.key, op.mark]
    if isinstance(op, Signal):
        return ["signal", op.key, op.name]
    if isinstance(op, Lease):
        return ["lease", op.key, repr(op.until)]
    return ["delete", op.key]
