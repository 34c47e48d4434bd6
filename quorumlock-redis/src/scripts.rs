//! The server-side scripts: every step that reads and changes a queue is
//! one Lua script, so Redis runs it atomically (run by EVALSHA, with EVAL
//! when the server does not have it cached, by `redis::Script`).
//!
//! Redis cannot expire a member of a sorted set, so every script that
//! decides a grant first reads the queue from its head up to the first
//! entry that does not hold, purging the entries whose session key is
//! gone on the way (`head`; the admin scripts read it all, `load`), then
//! grants every entry that holds by the queue rules and has no token yet
//! (`settle`): `INCR` of the per-name counter gives its token, and one
//! message in its session's mailbox wakes that waiter alone (herd-free).
//!
//! Keys are computed inside the scripts from `ARGV[1]` (the caller's
//! namespace prefix), the lock key and the entries: fine on a single
//! Redis or a primary with replicas, not on Redis Cluster (the README
//! says so).
//!
//! An entry names its session by the prefix and id of the client that
//! wrote it, and is judged alive by that session key alone: lock `x` of
//! namespace `app` is lock `app/x` of the namespace above (the same
//! keys), and a client there reads the entry with another prefix of its
//! own.

use std::sync::LazyLock;

use redis::Script;

/// Functions the scripts share; each script carries those it uses
/// ([`with_lib`]). `P` is the caller's namespace
/// prefix: the caller's own session keys are under it (`skey`), another
/// entry's are under the prefix the entry names (`ekey`).
const LIB: &str = r#"
local P = ARGV[1]
local function skey(sid) return P .. '.session/' .. sid end
local function mkey(sid) return P .. '.session/' .. sid .. '/.mail' end
-- An entry: `kind permits sid created token prefix`, the prefix (maybe
-- empty) of the client that wrote it, whose session key is `ekey`.
local function parse(v)
  local kind, permits, sid, created, token, p =
    string.match(v, '^(%a) (%d+) (%x+) (%d+) (%d+) (.*)$')
  if not kind then return nil end
  return {kind = kind, permits = tonumber(permits), sid = sid,
          created = created, token = tonumber(token), p = p}
end
local function fmt(e)
  return e.kind .. ' ' .. e.permits .. ' ' .. e.sid .. ' ' .. e.created .. ' '
    .. string.format('%d', e.token) .. ' ' .. e.p
end
local function ekey(e) return e.p .. '.session/' .. e.sid end
-- The member of its session's `.locks` set that stands for entry `id`
-- of L (the entry's name, as the Rust side writes it).
local function member(L, id) return L .. '/.q/' .. id end
-- Tells the followers of L (`Backend::changes`) that its queue changed:
-- a message on its channel, which costs nothing when nobody listens.
-- Once per script and lock: a follower reads the queue after the script
-- ends, so a second message would only make it read again. Best effort
-- (`pcall`): a user whose ACL refuses the channel must not see a script
-- abort halfway through its writes.
local announced = {}
local function changed(L)
  if announced[L] then return end
  announced[L] = true
  redis.pcall('PUBLISH', L .. '/.changes', '')
end
-- The caller's session `sid` lives `ttl` ms more from now, with the keys
-- kept beside it; false if its key is gone (never brought back).
local function extend(sid, ttl)
  local s = skey(sid)
  if redis.call('PEXPIRE', s, ttl) == 0 then return false end
  -- The entry set, a TTL past the session key: see KILL.
  redis.call('PEXPIRE', s .. '/.locks', 2 * tonumber(ttl))
  redis.call('PEXPIRE', s .. '/.fenced', ttl)
  redis.call('PEXPIRE', mkey(sid), ttl)
  return true
end
-- A message to entry e's session's mailbox if that session lives, kept
-- as long as the session.
local function tell(e, msg)
  local s = ekey(e)
  local pttl = redis.call('PTTL', s)
  if pttl > 0 then
    redis.call('RPUSH', s .. '/.mail', msg)
    redis.call('PEXPIRE', s .. '/.mail', pttl)
  end
end
-- Queue entry `id` of L (score `seq`) if its own session key exists; else
-- it is purged and nil (an entry that does not parse is nobody's).
local function live_entry(L, id, seq)
  local h = L .. '/.e'
  local v = redis.call('HGET', h, id)
  local e = v and parse(v)
  if e and redis.call('EXISTS', ekey(e)) == 1 then
    e.id = id
    e.seq = tonumber(seq)
    return e
  end
  redis.call('ZREM', L .. '/.q', id)
  if v then redis.call('HDEL', h, id) end
  redis.call('HDEL', L .. '/.v', id)
  changed(L)
  return nil
end
-- The queue of L in order, without (and purged of) entries whose session
-- key is gone.
local function load(L)
  local ids = redis.call('ZRANGE', L .. '/.q', 0, -1, 'WITHSCORES')
  local live = {}
  for i = 1, #ids, 2 do
    local e = live_entry(L, ids[i], ids[i + 1])
    if e then live[#live + 1] = e end
  end
  return live
end
-- How many entries of its request follow entry `id`: a request for
-- several permits at once is k entries side by side, `<contender>.<j>.<k>`
-- for its j-th (j < k) and `<contender>` for its last.
local function after(id)
  local j, k = string.match(id or '', '%.(%d+)%.(%d+)$')
  if j then return tonumber(k) - tonumber(j) end
  return 0
end
-- The id of the upgradeable entry that upgrade `id` upgrades
-- (`<contender>g<its contender>`).
local function upgraded(id) return string.match(id, 'g(%x+)$') end
-- Whether live[i] holds: a mutex or writer when first, a reader with no
-- writer (or upgrade) ahead, an upgradeable reader with only readers
-- ahead, an upgrade with no holder ahead but the entry it upgrades, a
-- permit with fewer than `permits` entries ahead (the entries of one
-- request hold together, when its last does). Once an entry does not
-- hold, none behind it does, but an upgrade (see `head`).
local function holds(live, i)
  local e = live[i]
  if e.kind == 'r' then
    for j = 1, i - 1 do
      local k = live[j].kind
      if k ~= 'r' and k ~= 'u' then return false end
    end
    return true
  elseif e.kind == 'u' then
    for j = 1, i - 1 do
      if live[j].kind ~= 'r' then return false end
    end
    return true
  elseif e.kind == 'g' then
    local of, u = upgraded(e.id), nil
    for j = 1, i - 1 do
      if live[j].id == of then
        u = j
      elseif holds(live, j) then
        return false
      end
    end
    -- Not while a reader waits between the two (see `refused`).
    if u then
      for j = u + 1, i - 1 do
        if live[j].kind == 'r' and not holds(live, j) then return false end
      end
    end
    return true
  elseif e.kind == 's' then
    return i + after(e.id) <= e.permits
  end
  return i == 1
end
-- Whether live[i] is an upgrade to refuse: the entry it upgrades is gone;
-- or no holder ahead of it but that entry, and a reader waits between the two (behind a writer
-- that waits for that entry): granted, it would let that reader in
-- beside the write once the writer left; waited for, it would wait for
-- ever (`quorumlock_core::backend::upgrade_refused`).
local function refused(live, i)
  local e = live[i]
  if e.kind ~= 'g' then return false end
  local of, found = upgraded(e.id), false
  for j = 1, i - 1 do
    if live[j].id == of then found = true end
  end
  -- The entry it upgrades is gone (every entry ahead is in `live`).
  if not found then return true end
  if holds(live, i) then return false end
  for j = 1, i - 1 do
    if live[j].id ~= of and holds(live, j) then return false end
  end
  return true
end
-- The live queue of L from its head up to and including the first entry
-- that does not hold, purging dead entries met on the way: all that a
-- grant depends on (entries behind cannot hold, see `holds`), so a
-- handoff costs the same with 4 or 64 waiters. While an upgradeable
-- reader holds, its upgrade may be anywhere behind and hold: then all of
-- it. The second value is whether that is the whole queue.
local function head(L)
  local live, start, upgradeable = {}, 0, false
  while true do
    -- Ranks as text: a number argument of `redis.call` is formatted
    -- with `%.17g`, a few thousand instructions each (most reads stop
    -- at the first page).
    local lo, hi = '0', '7'
    if start > 0 then lo, hi = string.format('%d', start), string.format('%d', start + 7) end
    local ids = redis.call('ZRANGE', L .. '/.q', lo, hi, 'WITHSCORES')
    for i = 1, #ids, 2 do
      local e = live_entry(L, ids[i], ids[i + 1])
      if e then
        live[#live + 1] = e
        -- Purged entries shift the ranks behind them: count only these.
        start = start + 1
        local h = holds(live, #live)
        if h and e.kind == 'u' then upgradeable = true end
        if not h and not upgradeable then return live, false end
      end
    end
    if #ids < 16 then return live, true end
  end
end
-- The next number of the per-name counter, raised to the server's clock
-- in microseconds for a token: strictly increasing on one server, and
-- after a failover still above the tokens the old primary gave, unless
-- the new primary's clock is behind by more than the time between them.
local function next_token(L)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local n = redis.call('INCR', L .. '/.n')
  if n < now then
    redis.call('SET', L .. '/.n', string.format('%d', now))
    n = now
  end
  return n
end
-- Grants every entry that holds and has no token yet: a token from
-- `next_token`, and a message to its session alone (not to `skip`, the
-- caller's own entry). An entry marked `unwritten` (queued by this
-- script, not yet in the hash) is left for its writer to write once.
local function settle(L, live, skip)
  for i, e in ipairs(live) do
    if e.token == 0 and holds(live, i) and not refused(live, i) then
      e.token = next_token(L)
      if not e.unwritten then redis.call('HSET', L .. '/.e', e.id, fmt(e)) end
      changed(L)
      -- A request of several permits is told once, by its last entry.
      if e.id ~= skip and after(e.id) == 0 then tell(e, 'g ' .. e.id) end
    elseif e.token == 0 and e.id ~= skip and refused(live, i) then
      -- Woken to learn it is refused.
      tell(e, 'g ' .. e.id)
    end
  end
end
-- Removes entry `id` of L (`e`, if the caller parsed it already), and
-- its member of its session's set, so that the set holds only the
-- entries still there.
local function remove(L, id, e)
  if not e then
    local v = redis.call('HGET', L .. '/.e', id)
    e = v and parse(v)
  end
  redis.call('ZREM', L .. '/.q', id)
  redis.call('HDEL', L .. '/.e', id)
  redis.call('HDEL', L .. '/.v', id)
  if e then redis.call('SREM', ekey(e) .. '/.locks', member(L, id)) end
  changed(L)
end
-- Removes the `count` entries of request `id` of L (its last is `id`,
-- `e` if the caller parsed it already).
local function remove_request(L, id, count, e)
  for j = 1, count - 1 do remove(L, id .. '.' .. j .. '.' .. count) end
  remove(L, id, e)
end
-- A waiting entry's answer: its seq, and the shortest time to live of
-- the sessions of live[1..n] (ahead of it; when to look again if nobody
-- wakes us).
local function waiting(seq, live, n)
  local ahead = -1
  for j = 1, n do
    local pttl = redis.call('PTTL', ekey(live[j]))
    if pttl > 0 and (ahead < 0 or pttl < ahead) then ahead = pttl end
  end
  return {'wait', seq, ahead}
end
-- Where live[i] stands: held (with its token), refused (an upgrade,
-- removed: see `refused`), or waiting.
local function standing(L, live, i)
  local e = live[i]
  if e.token > 0 then
    return {'held', e.token, e.seq}
  end
  if refused(live, i) then
    remove(L, e.id, e)
    return {'refused'}
  end
  return waiting(e.seq, live, i - 1)
end
-- live[i]'s standing (see `standing`) for its own client: a grant is
-- evidence that its session lives, read in the step that decides it, so
-- it renews the session as RENEW would. Its expiry may be earlier than
-- the client counts on (a failover that lost the last renewals, a step of
-- the server's clock): the grant must not outlive it.
local function own_standing(L, live, i, ttl)
  local r = standing(L, live, i)
  if r[1] == 'held' then extend(live[i].sid, ttl) end
  return r
end
"#;

fn script(body: &str) -> Script {
    Script::new(&with_lib(LIB, body))
}

/// `body` after the definitions of `lib` that it uses, directly or
/// through another, in `lib`'s order. Redis runs a script's whole text at
/// each call, so each `local function` it holds is a closure made anew
/// then, used or not (about 0.9k server instructions each, measured with
/// callgrind).
///
/// A definition is a top-level `local` line (`local function name` or
/// `local name =`, one name), the comment lines above it and every line
/// up to the next one; it is used when its name appears as a word in a
/// line of the text kept that is not a comment line (`--`; the scripts
/// have no long strings, `[[`, in which such a line would be text). A
/// word in a string or after code on its line keeps a definition it need
/// not, never the other way round, so a name a script calls is always
/// defined.
fn with_lib(lib: &str, body: &str) -> String {
    struct Definition<'a> {
        name: &'a str,
        text: String,
    }
    let mut defs: Vec<Definition<'_>> = Vec::new();
    let mut comments = String::new();
    for line in lib.lines() {
        match (defined_name(line), defs.last_mut()) {
            (Some(name), _) => defs.push(Definition {
                name,
                text: std::mem::take(&mut comments) + line + "\n",
            }),
            (None, _) if line.starts_with("--") => {
                comments.push_str(line);
                comments.push('\n');
            }
            (None, Some(def)) => {
                def.text.push_str(&comments);
                comments.clear();
                def.text.push_str(line);
                def.text.push('\n');
            }
            (None, None) => {}
        }
    }
    let mut used = vec![false; defs.len()];
    let mut pending = vec![body.to_owned()];
    while let Some(text) = pending.pop() {
        let code = text.lines().filter(|l| !l.trim_start().starts_with("--"));
        for word in code.flat_map(words) {
            for (i, def) in defs.iter().enumerate() {
                if !used[i] && def.name == word {
                    used[i] = true;
                    pending.push(def.text.clone());
                }
            }
        }
    }
    let mut out: String = defs
        .iter()
        .zip(&used)
        .filter(|(_, used)| **used)
        .map(|(def, _)| def.text.as_str())
        .collect();
    out.push_str(body);
    out
}

/// The name a top-level `local` line defines (`local function name`,
/// `local name =`).
fn defined_name(line: &str) -> Option<&str> {
    line.strip_prefix("local function ")
        .or_else(|| line.strip_prefix("local "))
        .and_then(|rest| words(rest).next())
}

/// The Lua names in `text` (and its other words).
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// Enqueue. ARGV: P, L, sid, contender, kind, permits, wait (0/1),
/// created (ms), the holder's value, the TTL (ms), the count of permits
/// (entries side by side, the last named by the contender). A new entry joins its
/// session's entry set, which is kept a TTL longer than the session key
/// (see [`KILL`]). `{'gone'}`, `{'fenced'}`, `{'conflict', kind, permits}`,
/// `{'wouldblock'}`, `{'held', token, seq}` or `{'wait', seq, ahead_ms}`.
pub(crate) static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L, sid, id = ARGV[2], ARGV[3], ARGV[4]
local kind, permits, wait, created = ARGV[5], tonumber(ARGV[6]), ARGV[7], ARGV[8]
local count = tonumber(ARGV[11])
local added = false
if redis.call('EXISTS', skey(sid)) == 0 then return {'gone'} end
if redis.call('ZSCORE', skey(sid) .. '/.fenced', id) then return {'fenced'} end
local live, whole = head(L)
local mine
for i, e in ipairs(live) do
  if e.id == id then mine = i end
end
-- Not among the whole queue read (our session lives, so ours would be
-- live), or not queued behind it: a new entry.
local seq = not mine and not whole and redis.call('ZSCORE', L .. '/.q', id)
if not mine and not seq then
  local first = live[1]
  if first then
    local clash
    if first.kind == 's' and kind == 's' then
      clash = first.permits ~= permits
    else
      clash = (first.kind == 's') ~= (kind == 's')
    end
    if clash then
      settle(L, live, '')
      return {'conflict', first.kind, first.permits}
    end
  end
  -- Behind an entry that does not hold, ours would not either.
  if not whole and wait == '0' then
    settle(L, live, '')
    return {'wouldblock'}
  end
  added = true
  for j = 1, count do
    local eid = id
    if j < count then eid = id .. '.' .. j .. '.' .. count end
    seq = redis.call('INCR', L .. '/.n')
    local e = {kind = kind, permits = permits, sid = sid, created = created,
               token = 0, id = eid, seq = seq, p = P}
    redis.call('ZADD', L .. '/.q', seq, eid)
    if ARGV[9] ~= '' then redis.call('HSET', L .. '/.v', eid, ARGV[9]) end
    redis.call('SADD', skey(sid) .. '/.locks', member(L, eid))
    if whole then
      -- Written once, after `settle` (with its token if it holds).
      e.unwritten = true
      live[#live + 1] = e
    else
      redis.call('HSET', L .. '/.e', eid, fmt(e))
    end
  end
  changed(L)
  if whole then mine = #live end
end
settle(L, live, id)
for _, e in ipairs(live) do
  if e.unwritten then
    redis.call('HSET', L .. '/.e', e.id, fmt(e))
    e.unwritten = nil
  end
end
local answer
if not mine then
  -- Queued (by now) behind the part of the queue that `head` read, with
  -- our session alive: waiting.
  if wait == '0' then
    remove_request(L, id, count)
    answer = {'wouldblock'}
  else
    answer = waiting(tonumber(seq), live, #live)
  end
elseif live[mine].token == 0 and wait == '0' and not refused(live, mine) then
  remove_request(L, id, count)
  settle(L, head(L), '')
  answer = {'wouldblock'}
else
  answer = own_standing(L, live, mine, ARGV[10])
end
-- New entries joined the session's entry set: it lives a TTL past the
-- session key (see KILL). A grant renewed both already (`extend`).
if added and answer[1] ~= 'held' then
  redis.call('PEXPIRE', skey(sid) .. '/.locks',
    redis.call('PTTL', skey(sid)) + tonumber(ARGV[10]))
end
return answer
"#,
    )
});

/// Look again at a waiting entry. ARGV: P, L, contender, the TTL (ms).
/// `{'gone'}`,
/// `{'held', token, seq}` or `{'wait', seq, ahead_ms}`.
pub(crate) static CHECK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L, id = ARGV[2], ARGV[3]
local live, whole = head(L)
settle(L, live, id)
for i, e in ipairs(live) do
  if e.id == id then return own_standing(L, live, i, ARGV[4]) end
end
if whole then return {'gone'} end
-- Behind the part read, so waiting: unless not queued, or its session
-- is gone (then purged, as `head` purges).
local seq = redis.call('ZSCORE', L .. '/.q', id)
local e = seq and live_entry(L, id, seq)
if not e then return {'gone'} end
return waiting(e.seq, live, #live)
"#,
    )
});

/// Release a held entry (only the grant `token` of it), and the other
/// entries of its request. ARGV: P, L, contender, token, count. 1 if it
/// was there.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L, id, token, count = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local v = redis.call('HGET', L .. '/.e', id)
local e = v and parse(v)
local found = 0
if e and e.token == token then
  remove_request(L, id, count, e)
  found = 1
end
settle(L, head(L), '')
return found
"#,
    )
});

/// Remove whatever an attempt wrote; with fence = 1, also stop a late
/// copy of its enqueue for as long as its session `sid` lives: the
/// contender joins the session's fences (`P.session/<sid>/.fenced`, a
/// sorted set by server time, kept as long as the session and ended with
/// it; the newest [`FENCES`] are kept). ARGV: P, L, contender, fence, sid,
/// count (the entries of the request).
pub(crate) static ABANDON: LazyLock<Script> = LazyLock::new(|| {
    script(&format!(
        r#"
local L, id, fence, sid = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
remove_request(L, id, tonumber(ARGV[6]))
if fence == '1' then
  -- A session already gone needs no fence: the enqueue checks it first.
  local pttl = redis.call('PTTL', skey(sid))
  if pttl > 0 then
    local f = skey(sid) .. '/.fenced'
    local t = redis.call('TIME')
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', f, string.format('%d', ms), id)
    redis.call('ZREMRANGEBYRANK', f, 0, -{keep})
    redis.call('PEXPIRE', f, pttl)
  end
end
settle(L, head(L), '')
return 1
"#,
        keep = FENCES + 1
    ))
});

/// How many fences of abandoned attempts a session keeps (the newest):
/// a bound on its memory for a client whose writes often end unknown.
/// A late enqueue of an attempt fenced longer ago is refused by nothing,
/// and its entry is left to the renewal's reconciliation.
pub(crate) const FENCES: usize = 1000;

/// Forced break: removes the holders, tells their sessions, grants the
/// next. ARGV: P, L. The number of holders removed.
pub(crate) static BREAK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L = ARGV[2]
local live = load(L)
settle(L, live, '')
local n = 0
for i, e in ipairs(live) do
  if holds(live, i) then
    remove(L, e.id, e)
    tell(e, 'l ' .. e.id)
    n = n + 1
  end
end
settle(L, load(L), '')
return n
"#,
    )
});

/// Cooperative revoke: a message to each holder's session. ARGV: P, L.
/// The number of holders.
pub(crate) static REVOKE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L = ARGV[2]
local live = load(L)
settle(L, live, '')
local n = 0
for i, e in ipairs(live) do
  if holds(live, i) then
    tell(e, 'r ' .. e.id)
    n = n + 1
  end
end
return n
"#,
    )
});

/// Ends a session: its key goes, the queues of its entries (its set's
/// members, `L/.q/<contender>`) are purged and settled (the next waiters
/// granted), its fences and marks go. With notify = 1 its mailbox gets
/// `x` (kept `ttl` ms) so its own client learns at once; else the mailbox
/// goes too. ARGV: P, sid, notify, ttl. 1 if the session existed.
///
/// The entry set outlives the session key by a TTL ([`ENQUEUE`] and
/// [`RENEW`] set its expiry so), so this script still removes the entries
/// of a session whose key has already expired: a client whose link was
/// down when its session ended sends it again once the link is back
/// (Redis expires keys, never the members of a queue, so nothing else
/// would remove them but a later reader of each queue).
pub(crate) static KILL: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local sid, notify, ttl = ARGV[2], ARGV[3], ARGV[4]
local s = skey(sid)
local members = redis.call('SMEMBERS', s .. '/.locks')
local existed = redis.call('DEL', s)
redis.call('DEL', s .. '/.locks', s .. '/.fenced', s .. '/.stray')
if notify == '1' and existed == 1 then
  redis.call('RPUSH', mkey(sid), 'x')
  redis.call('PEXPIRE', mkey(sid), ttl)
else
  redis.call('DEL', mkey(sid))
end
-- Each queue once, however many entries the session had in it.
local seen = {}
for _, m in ipairs(members) do
  local L = string.match(m, '^(.*)/%.q/[^/]*$')
  if L and not seen[L] then
    seen[L] = true
    settle(L, load(L), '')
  end
end
return existed
"#,
    )
});

/// Renews a session and what lives as long as it (its entry set a TTL
/// longer, see [`KILL`]): one step of O(1) work, however many entries the
/// session has. ARGV: P, sid, ttl. 1, or 0 if the session is gone.
///
/// The rest of a renewal is sent in parts of at most
/// `monitor::RENEWAL_PART` entries each (`monitor::Audit`), so that a
/// client holding many locks never keeps Redis, which runs one command
/// at a time, busy for long: the check that the held entries are still
/// there (a failover to a replica that never got a grant keeps the
/// session key but not the entry), the followers' notices, and
/// [`RECONCILE`] of the entries its client no longer owns.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if not extend(ARGV[2], ARGV[3]) then return 0 end
return 1
"#,
    )
});

/// Removes the session's entries its client no longer owns, two renewals
/// after it first found them.
///
/// An entry of the session (a member of its `.locks` set) whose contender
/// is not among those the client owns (every attempt it has not released
/// or abandoned: waiting or held) is one it gave up whose removal was
/// lost (a release or abandon a failover lost) or that was made after it
/// (an enqueue that landed late). The client lists the set's members
/// after it took the list of what it owns, and sends the members not
/// owned here. Such a member is marked with the renewal's number `n` (in
/// `P.session/<sid>/.stray`) and removed, its queue settled, by the first
/// later renewal that names it again and whose client saw renewal `n`
/// answered whole (it sends that number as `confirmed`). Two steps
/// because an attempt the client started after it took renewal `n`'s
/// list may have enqueued before the members were listed: not owned by
/// that list, yet owned. Its enqueue came before the listing, so it was
/// routed before renewal `n` was answered, so before the next renewal's
/// list was taken: owned there, it is not named again. A renewal whose
/// answer was lost marks with a number the client never confirms, so its
/// marks are renewed by the next one; one that lands late only marks (or
/// removes) members no list owned, and a contender is never owned again.
///
/// ARGV: P, sid, ttl, n, confirmed (0: none yet), then members not owned.
/// The number of entries removed.
pub(crate) static RECONCILE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local sid, ttl, n, confirmed = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local s = skey(sid)
if redis.call('EXISTS', s) == 0 then return 0 end
local stray = s .. '/.stray'
local removed, queues, seen = 0, {}, {}
for i = 6, #ARGV do
  local m = ARGV[i]
  local L, id = string.match(m, '^(.*)/%.q/([^/]*)$')
  if L then
    if redis.call('HGET', stray, m) == confirmed then
      local v = redis.call('HGET', L .. '/.e', id)
      local e = v and parse(v)
      if e and e.sid == sid and e.p == P then
        remove(L, id, e)
        removed = removed + 1
        if not seen[L] then
          seen[L] = true
          queues[#queues + 1] = L
        end
      end
      redis.call('SREM', s .. '/.locks', m)
      redis.call('HDEL', stray, m)
    else
      redis.call('HSET', stray, m, n)
    end
  end
end
redis.call('PEXPIRE', stray, ttl)
for _, L in ipairs(queues) do settle(L, head(L), '') end
return removed
"#,
    )
});

/// WAIT mode: rewrites a granted entry unchanged, on the connection the
/// `WAIT` for its grant is then sent on: a write after the grant, so at
/// or after it in the replication stream (`WAIT` waits for the
/// connection's last write). ARGV: P, L, contender, token. 1 if the
/// entry holds with that token on a live session, else 0 (nothing
/// written).
pub(crate) static CONFIRM: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L, id, token = ARGV[2], ARGV[3], tonumber(ARGV[4])
local v = redis.call('HGET', L .. '/.e', id)
local e = v and parse(v)
if not e or e.token ~= token or e.token == 0 then return 0 end
if redis.call('EXISTS', ekey(e)) == 0 then return 0 end
redis.call('HSET', L .. '/.e', id, v)
return 1
"#,
    )
});

/// Sets a held entry's value (an election leader's proclaim), only while
/// the entry holds with its grant `token` and its session lives. ARGV: P,
/// L, contender, token, value. 1 if set.
pub(crate) static SET_VALUE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L, id, token, value = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local v = redis.call('HGET', L .. '/.e', id)
local e = v and parse(v)
if not e or e.token ~= token or e.token == 0 then return 0 end
if redis.call('EXISTS', ekey(e)) == 0 then return 0 end
if value == '' then
  redis.call('HDEL', L .. '/.v', id)
else
  redis.call('HSET', L .. '/.v', id, value)
end
changed(L)
return 1
"#,
    )
});

/// When each session owning an entry of a lock expires unless renewed:
/// a flat list of session key and ms from now, 0 for one gone already (an
/// entry that does not parse counts as a session key '' gone); none for a
/// session without a TTL (it never expires). ARGV: P, L. Nothing else
/// tells a follower of the lock that an entry's session expired (its
/// entries go when a script next loads the queue); a renewal tells it of
/// a renewal, by the same session key (`monitor::Audit::finish`).
pub(crate) static SESSION_EXPIRIES: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L = ARGV[2]
local out, seen = {}, {}
for _, id in ipairs(redis.call('ZRANGE', L .. '/.q', 0, -1)) do
  local v = redis.call('HGET', L .. '/.e', id)
  local e = v and parse(v)
  local s = e and ekey(e) or ''
  if not seen[s] then
    seen[s] = true
    -- -2: gone (its entries go at the next load); -1: no TTL.
    local pttl = e and redis.call('PTTL', s) or -2
    if pttl == -2 then pttl = 0 end
    if pttl >= 0 then
      out[#out + 1] = s
      out[#out + 1] = pttl
    end
  end
end
return out
"#,
    )
});

/// The queue of a lock after purging (entries whose own session key is
/// gone, whatever the caller's namespace) and settling. ARGV: P, L. A flat
/// list: contender, kind, permits, sid, created, token, seq, holds (0/1),
/// the holder's value.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local L = ARGV[2]
local live = load(L)
settle(L, live, '')
local out = {}
for i, e in ipairs(live) do
  local h = 0
  if holds(live, i) then h = 1 end
  -- Numbers as integers: tostring gives 1.7e+15 for a token.
  for _, x in ipairs({e.id, e.kind, e.permits, e.sid, e.created, e.token, e.seq, h}) do
    if type(x) == 'number' then x = string.format('%d', x) end
    out[#out + 1] = x
  end
  out[#out + 1] = redis.call('HGET', L .. '/.v', e.id) or ''
end
return out
"#,
    )
});

/// A write applied only while every held entry is still on the store with
/// its token, and its session alive. ARGV: P, op (`put`/`del`), key,
/// value, then (lock key, contender, token) per entry. 1 if applied.
pub(crate) static FENCED: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local op, key, value = ARGV[2], ARGV[3], ARGV[4]
for i = 5, #ARGV, 3 do
  local v = redis.call('HGET', ARGV[i] .. '/.e', ARGV[i + 1])
  local e = v and parse(v)
  if not e or e.token ~= tonumber(ARGV[i + 2]) or e.token == 0 then return 0 end
  if redis.call('EXISTS', ekey(e)) == 0 then return 0 end
end
if op == 'put' then
  redis.call('SET', key, value)
else
  redis.call('DEL', key)
end
return 1
"#,
    )
});

#[cfg(test)]
mod queue_rule_tests;
#[cfg(test)]
mod tests {
    use super::{defined_name, with_lib, LIB};

    /// The names `text` defines at its top level, in order.
    fn defined(text: &str) -> Vec<&str> {
        text.lines().filter_map(defined_name).collect()
    }

    #[test]
    fn a_script_carries_the_definitions_it_uses_and_no_other() {
        let body = "return extend(ARGV[2], ARGV[3])";
        let script = with_lib(LIB, body);
        assert_eq!(defined(&script), ["P", "skey", "mkey", "extend"]);
        assert!(script.ends_with(body));
        // Through `settle`: the queue rule and what a grant writes, not
        // the caller's own session keys.
        let script = with_lib(LIB, "settle(ARGV[2], head(ARGV[2]), '')");
        for name in [
            "holds",
            "after",
            "upgraded",
            "refused",
            "next_token",
            "tell",
            "announced",
        ] {
            assert!(defined(&script).contains(&name), "{name} is missing");
        }
        for name in ["P", "skey", "extend", "load", "waiting", "standing"] {
            assert!(!defined(&script).contains(&name), "{name} is carried");
        }
        // A name in a comment line keeps nothing: `holds`' comment names
        // `head`.
        let script = with_lib(LIB, "return holds({}, 1)");
        assert_eq!(defined(&script), ["after", "upgraded", "holds"]);
    }

    #[test]
    fn a_script_that_uses_everything_carries_the_whole_library() {
        // One name per top-level `local`: `with_lib` reads the first.
        for line in LIB.lines().filter(|l| l.starts_with("local ")) {
            let declared = line.split(['=', '(']).next().unwrap();
            assert!(
                !declared.contains(','),
                "two names in one definition: {line}"
            );
        }
        let names = defined(LIB);
        assert!(names.len() > 20, "{names:?}");
        let body = names.join("\n");
        assert_eq!(
            with_lib(LIB, &body),
            format!("{}{body}", LIB.trim_start_matches('\n'))
        );
    }
}
