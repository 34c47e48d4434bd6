//! The tables on the server (in the schema the URL names), the names of
//! entries, the kinds as stored, and the channels of the sessions'
//! wake-ups. Every statement of the crate names its tables through
//! [`Sql`], with the schema filled in once.

use quorumlock_core::{Error, ErrorKind, LockKind, Result};
use uuid::Uuid;

/// The first key of every advisory lock this crate takes (two-key form,
/// a lock space of its own: programs that use the one-key
/// `pg_advisory_lock(bigint)` never meet it): "qlk".
pub(crate) const ADVISORY_CLASS: i32 = 0x71_6c_6b;

/// The bits of a fencing token below the timeline: the sequence's value
/// (below 2^40). A token is `timeline << 40 | value`.
pub(crate) const SEQ_BITS: u32 = 40;

/// The largest timeline a token can carry: its bits end below the sign
/// bit of a `bigint`.
pub(crate) const MAX_TIMELINE: i64 = (1 << (63 - SEQ_BITS)) - 1;

/// An enqueue whose arrival value (from the same sequence as the tokens)
/// reaches this is refused: the 2^32 values left are for the grants of
/// the entries already queued, so that a release (which grants the next)
/// never fails for want of a token.
pub(crate) const ENQUEUE_LIMIT: i64 = (1 << SEQ_BITS) - (1 << 32);

/// The server's current WAL insert timeline, from the name of the WAL
/// file it writes (its first 8 hex digits). Right after a promotion it is
/// already the new timeline (`pg_control_checkpoint()`'s is not until the
/// end-of-recovery checkpoint); on a standby it is an error (as a write
/// would be).
pub(crate) const TIMELINE: &str =
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint";

/// The tables, created on first use (one transaction, under the advisory
/// lock `(ADVISORY_CLASS, 0)` so that clients starting together do not
/// race on the catalog). `{s}` is the quoted schema.
///
/// - `sessions`: one row per client session; `expires` is the server's
///   `clock_timestamp()` at the last renewal plus the TTL. A session is
///   alive while `expires > clock_timestamp()`; a missing row is a dead
///   session.
/// - `entries`: one row per contender of a lock, in arrival order by
///   `seq` (from the sequence `seq`); `token` is null while it waits and,
///   once granted, the server's timeline above the sequence's next value
///   ([`token`]), so tokens grow across every kind on a name (and across
///   names) within a timeline, and a promotion (a new, larger timeline)
///   puts every later token above every token of the old one.
/// - `fences`: attempts given up while their enqueue's outcome was
///   unknown; an enqueue that finds its contender here writes nothing.
///   They go with their session.
/// - `kv`: the key space of fenced writes.
pub(crate) const SCHEMA: &str = r#"
CREATE SCHEMA IF NOT EXISTS {s};
CREATE SEQUENCE IF NOT EXISTS {s}.seq;
CREATE TABLE IF NOT EXISTS {s}.sessions (
    id uuid PRIMARY KEY,
    prefix text NOT NULL,
    ttl_ms bigint NOT NULL,
    expires timestamptz NOT NULL,
    created timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS sessions_expires ON {s}.sessions (expires);
CREATE TABLE IF NOT EXISTS {s}.entries (
    lock text NOT NULL,
    seq bigint NOT NULL,
    contender uuid NOT NULL UNIQUE,
    session uuid NOT NULL,
    kind text NOT NULL,
    permits integer NOT NULL,
    token bigint,
    revoke boolean NOT NULL DEFAULT false,
    created timestamptz NOT NULL DEFAULT clock_timestamp(),
    value bytea NOT NULL,
    PRIMARY KEY (lock, seq)
);
CREATE INDEX IF NOT EXISTS entries_session ON {s}.entries (session);
CREATE TABLE IF NOT EXISTS {s}.fences (
    contender uuid PRIMARY KEY,
    session uuid NOT NULL
);
CREATE INDEX IF NOT EXISTS fences_session ON {s}.fences (session);
CREATE TABLE IF NOT EXISTS {s}.kv (
    key text PRIMARY KEY,
    value bytea NOT NULL
);
"#;

/// What notifies a lock's followers ([`Sql::follow_channel`]): the
/// table `followers` (a row per lock and listening backend), a trigger
/// that, for every entry added, removed, granted or given a new value,
/// sends a `NOTIFY` on the lock's channel, and one that, for every
/// session renewed, sends `r <session> <ms it lives>` on the channel of each
/// lock it has an entry of (so the followers need not read when it
/// expires, [`Sql::session_expiries`]); each only if the lock has a
/// follower: a `NOTIFY` serialises the commits that send one (a lock held
/// through commit), which cost the bench 6-45 % when every change sent
/// one. PostgreSQL folds the copies one transaction sends on one channel
/// into one, and delivers them at commit. Created apart from [`SCHEMA`],
/// in a transaction of its own: a schema made before it existed gets it
/// without the tables' statements, and a user who may not create
/// triggers keeps working, without notifications (followers then read
/// every few seconds). A trigger is created only where it is missing
/// (`CREATE OR REPLACE TRIGGER` is PostgreSQL 14's, and a `DROP TRIGGER`
/// would take an exclusive lock on the hot table on every upgrade);
/// `CREATE TRIGGER` takes a lock that waits for writers of the table in
/// progress and holds up the next ones for as long as it takes: once,
/// when the first client of a version finds its trigger missing.
pub(crate) const TRIGGER: &str = r#"
CREATE TABLE IF NOT EXISTS {s}.followers (
    lock text NOT NULL,
    pid integer NOT NULL,
    PRIMARY KEY (lock, pid)
);
CREATE OR REPLACE FUNCTION {s}.entries_changed() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF EXISTS (SELECT 1 FROM {s}.followers f WHERE f.lock = COALESCE(NEW.lock, OLD.lock)) THEN
        PERFORM pg_notify('qlc_' || md5(COALESCE(NEW.lock, OLD.lock)), '');
    END IF;
    RETURN NULL;
END $f$;
CREATE OR REPLACE FUNCTION {s}.session_renewed() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE
    remaining bigint := (extract(epoch FROM (NEW.expires - clock_timestamp())) * 1000)::bigint;
BEGIN
    IF remaining > 0 THEN
        -- From the followers (few, mostly none: then the query is one
        -- look at an empty table), not from the session's entries (a
        -- bulk holder has thousands).
        PERFORM pg_notify('qlc_' || md5(l.lock), 'r ' || NEW.id || ' ' || remaining)
            FROM (SELECT DISTINCT f.lock FROM {s}.followers f
                  WHERE EXISTS (SELECT 1 FROM {s}.entries e
                                WHERE e.lock = f.lock AND e.session = NEW.id)) l;
    END IF;
    RETURN NULL;
END $f$;
DO $d$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'entries_changed' AND tgrelid = to_regclass('{s}.entries')) THEN
        CREATE TRIGGER entries_changed
            AFTER INSERT OR DELETE OR UPDATE OF token, value ON {s}.entries
            FOR EACH ROW EXECUTE FUNCTION {s}.entries_changed();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'session_renewed' AND tgrelid = to_regclass('{s}.sessions')) THEN
        CREATE TRIGGER session_renewed
            AFTER UPDATE OF expires ON {s}.sessions
            FOR EACH ROW EXECUTE FUNCTION {s}.session_renewed();
    END IF;
END $d$;
"#;

/// The kinds whose queues [`STEPS`] decide on the server: a mutex,
/// writer, election candidate or upgradeable reader, each holding when
/// first (in a queue of these kinds alone), and a single permit of a
/// semaphore, holding when fewer than its count are ahead (in a queue of
/// single permits of that count alone). For these queues the rule is a
/// window: the first `w` entries hold (`w` = 1, or the permit count),
/// each other waits for the entry `w` places ahead
/// ([`fast_window`], checked against `quorumlock_core::backend::holds`).
pub(crate) const FAST_KINDS: [&str; 4] = ["x", "w", "e", "u"];

/// The window of a queue of stored kind `code` with `permits`, where
/// [`STEPS`] decides it: `None` for the kinds left to the transactions
/// in Rust (readers, upgrades, several permits at once).
pub(crate) fn fast_window(code: &str, permits: i32) -> Option<usize> {
    match code {
        "s" => Some(permits.max(1) as usize),
        c if FAST_KINDS.contains(&c) => Some(1),
        _ => None,
    }
}

/// One statement per step, for the queues whose rule is a window
/// ([`fast_window`]): an acquire, a release and the grants after a
/// change are each one round trip, where the transactions in
/// `queue.rs` take five (the rule decided in Rust between them). Every
/// other queue, and every case these do not cover (an entry already
/// there, a kind of another window anywhere in the queue), is answered
/// `slow` with nothing written, and goes to those transactions. Each
/// runs under the queue's advisory lock, as they do, and writes what
/// they would: the purge of dead entries (and the sweep after it), the
/// grants in queue order with a `NOTIFY` to each new holder's session,
/// the entry. A token or an arrival value that would not fit raises
/// `QLTOK` with the numbers (`token <token> <timeline>`, `enqueue <seq>
/// <timeline>`), so the statement writes nothing and Rust words the error
/// ([`raised`]). They run with `enable_seqscan = off`: PL/pgSQL keeps a
/// connection's plan of each statement, and a plan made while the
/// entries table looked empty (a fresh schema, or just after
/// autoanalyze found it empty) scanned the whole table on every call once
/// it held thousands of entries (the bench's release of 10,000 locks took
/// 3-6 s instead of 0.9, with 50 million rows read); every statement
/// here has its index but the sweep's look at the fences, a small table.
/// With `enable_bitmapscan = off` too: each release leaves its entry dead
/// in the table until a vacuum, and a busy lock has thousands; a plain
/// index scan marks the dead entries it meets, so the next scan skips
/// them, where a bitmap scan returns every one, at every step (chosen
/// for a table not analyzed yet that dead entries had grown: one lock's
/// acquire went from 0.18 to 0.35 ms over 9,000 cycles, and its steps
/// returned 4,000 index entries each after 2,000;
/// `tests/steps.rs` `a_busy_locks_dead_entries_are_not_read_at_every_step`).
/// And with `jit = off`: that look's cost, raised by the setting,
/// crossed `jit_above_cost`, and each sweep spent 100 ms compiling.
/// And with `plan_cache_mode = force_generic_plan`: every statement
/// here finds its rows by key, and PL/pgSQL otherwise plans a statement
/// again at every call once the table's statistics make the plan for any
/// lock look costlier than one for this lock (a lock that had many
/// entries when the table was analyzed): planning cost each acquire and
/// release 30-40 us, a third of its time on the server
/// ([`STEP_SETTINGS`]). `{s}` is the quoted schema; `$1` in [`PURGE`] and
/// [`SWEEP`] is each function's first argument, the lock.
pub(crate) const STEPS: &str = r#"
CREATE OR REPLACE FUNCTION {s}.timeline_3() RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
    tl bigint := {TIMELINE};
BEGIN
    IF tl < 1 OR tl > {MAX_TIMELINE} THEN
        RAISE EXCEPTION USING ERRCODE = 'QLTOK', MESSAGE = 'enqueue 0 ' || tl;
    END IF;
    RETURN tl;
END $f$;
CREATE OR REPLACE FUNCTION {s}.settle_3(l text, w integer) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
    r record;
    tl bigint;
    nv bigint;
BEGIN
    FOR r IN SELECT e.contender, e.session, e.token FROM {s}.entries e
             WHERE e.lock = l ORDER BY e.seq LIMIT w LOOP
        CONTINUE WHEN r.token IS NOT NULL;
        IF tl IS NULL THEN
            tl := {s}.timeline_3();
        END IF;
        nv := nextval('{s}.seq');
        IF nv >= (1::bigint << {SEQ_BITS}) THEN
            RAISE EXCEPTION USING ERRCODE = 'QLTOK',
                MESSAGE = 'token ' || ((tl << {SEQ_BITS}) + nv) || ' ' || tl;
        END IF;
        UPDATE {s}.entries SET token = (tl << {SEQ_BITS}) + nv WHERE contender = r.contender;
        -- A session of version 3 or later (its id a UUID of version
        -- 8, `session_id`) is told the token too, and reads nothing
        -- when woken; an older one reads it.
        PERFORM pg_notify('ql_' || replace(r.session::text, '-', ''),
                          'g ' || replace(r.contender::text, '-', '')
                          || CASE WHEN substr(r.session::text, 15, 1) = '8'
                                  THEN ' ' || ((tl << {SEQ_BITS}) + nv) ELSE '' END);
    END LOOP;
END $f$;
CREATE OR REPLACE FUNCTION {s}.enqueue_3(l text, c uuid, sid uuid, k text, p integer, v bytea,
    wait boolean, OUT outcome text, OUT granted bigint, OUT ahead_ms bigint)
LANGUAGE plpgsql {SETTINGS} AS $f$
DECLARE
    w integer := CASE WHEN k = 's' THEN GREATEST(p, 1) ELSE 1 END;
    n bigint;
    odd bigint;
    dead bigint;
    tl bigint;
    arrival bigint;
    nv bigint;
BEGIN
    PERFORM pg_advisory_xact_lock({ADVISORY_CLASS}, hashtext(l));
    IF NOT (k = 's' OR k IN ({FAST_KINDS})) THEN
        outcome := 'slow';
        RETURN;
    END IF;
    -- The queue's entries, and those of another window or this attempt.
    SELECT count(*), count(*) FILTER (WHERE e.contender = c OR NOT
             CASE WHEN k = 's' THEN e.kind = 's' AND e.permits = p
                  ELSE e.kind IN ({FAST_KINDS}) END)
      INTO n, odd FROM {s}.entries e WHERE e.lock = l;
    IF odd > 0 THEN
        outcome := 'slow';
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = sid
                   AND expires > clock_timestamp() FOR KEY SHARE) THEN
        outcome := 'dead';
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {s}.fences f WHERE f.contender = c) THEN
        outcome := 'fenced';
        RETURN;
    END IF;
    IF n > 0 THEN
        {PURGE};
        GET DIAGNOSTICS dead = ROW_COUNT;
        n := n - dead;
        PERFORM {s}.settle_3(l, w);
    END IF;
    -- The arrival value first, as the transaction inserts before it
    -- knows whether the entry would wait.
    tl := {s}.timeline_3();
    arrival := nextval('{s}.seq');
    IF arrival < 0 OR arrival >= {ENQUEUE_LIMIT} THEN
        RAISE EXCEPTION USING ERRCODE = 'QLTOK', MESSAGE = 'enqueue ' || arrival || ' ' || tl;
    END IF;
    IF n >= w AND NOT wait THEN
        outcome := 'busy';
        IF dead > 0 THEN
            {SWEEP};
        END IF;
        RETURN;
    END IF;
    IF n < w THEN
        nv := nextval('{s}.seq');
        IF nv >= (1::bigint << {SEQ_BITS}) THEN
            RAISE EXCEPTION USING ERRCODE = 'QLTOK',
                MESSAGE = 'token ' || ((tl << {SEQ_BITS}) + nv) || ' ' || tl;
        END IF;
        granted := (tl << {SEQ_BITS}) + nv;
        outcome := 'held';
    ELSE
        SELECT GREATEST(COALESCE(
                 (extract(epoch FROM (s.expires - clock_timestamp())) * 1000)::bigint, 0), 0)
          INTO ahead_ms
          FROM {s}.entries e LEFT JOIN {s}.sessions s ON s.id = e.session
          WHERE e.lock = l ORDER BY e.seq OFFSET n - w LIMIT 1;
        outcome := 'wait';
    END IF;
    INSERT INTO {s}.entries (lock, seq, contender, session, kind, permits, token, value)
        VALUES (l, arrival, c, sid, k, p, granted, v);
    -- After the insert, as the transaction does: our session, with an
    -- entry now, is not among the swept even if it expired this moment.
    IF dead > 0 THEN
        {SWEEP};
    END IF;
END $f$;
CREATE OR REPLACE FUNCTION {s}.remove_3(l text, c uuid) RETURNS bigint LANGUAGE plpgsql
{SETTINGS} AS $f$
DECLARE
    k text;
    p integer;
    others bigint;
    odd bigint;
    removed bigint;
    dead bigint;
BEGIN
    PERFORM pg_advisory_xact_lock({ADVISORY_CLASS}, hashtext(l));
    SELECT e.kind, e.permits INTO k, p FROM {s}.entries e WHERE e.lock = l AND e.contender = c;
    IF NOT FOUND OR NOT (k = 's' OR k IN ({FAST_KINDS})) THEN
        RETURN NULL;
    END IF;
    -- The other entries, and those of another window.
    SELECT count(*), count(*) FILTER (WHERE NOT
             CASE WHEN k = 's' THEN e.kind = 's' AND e.permits = p
                  ELSE e.kind IN ({FAST_KINDS}) END)
      INTO others, odd FROM {s}.entries e WHERE e.lock = l AND e.contender <> c;
    IF odd > 0 THEN
        RETURN NULL;
    END IF;
    -- How many it removed: none if a session's end (which does not take
    -- the queue's lock) deleted it since it was read.
    DELETE FROM {s}.entries WHERE contender = c;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF others > 0 THEN
        {PURGE};
        GET DIAGNOSTICS dead = ROW_COUNT;
        IF dead > 0 THEN
            {SWEEP};
        END IF;
        PERFORM {s}.settle_3(l, CASE WHEN k = 's' THEN GREATEST(p, 1) ELSE 1 END);
    END IF;
    RETURN removed;
END $f$;
"#;

/// `$1`: lock. Removes the entries whose session is dead.
const PURGE: &str = "DELETE FROM {s}.entries e WHERE e.lock = $1 AND NOT EXISTS \
     (SELECT 1 FROM {s}.sessions s WHERE s.id = e.session AND s.expires > clock_timestamp())";

/// Removes expired sessions that own no entry any more, and fences of
/// sessions that are gone.
const SWEEP: &str =
    "WITH gone AS (DELETE FROM {s}.sessions s WHERE s.expires <= clock_timestamp() \
       AND NOT EXISTS (SELECT 1 FROM {s}.entries e WHERE e.session = s.id) RETURNING s.id) \
     DELETE FROM {s}.fences f WHERE f.session IN (SELECT id FROM gone) \
       OR NOT EXISTS (SELECT 1 FROM {s}.sessions s WHERE s.id = f.session)";

/// The settings the functions of [`STEPS`] a client calls are made with
/// (why each: [`STEPS`]), as `pg_proc.proconfig` lists them.
const STEP_SETTINGS: [&str; 4] = [
    "enable_seqscan=off",
    "enable_bitmapscan=off",
    "jit=off",
    "plan_cache_mode=force_generic_plan",
];

/// [`STEPS`] with its constants filled in (the schema still `{s}`).
fn steps() -> String {
    let kinds: Vec<String> = FAST_KINDS.iter().map(|k| format!("'{k}'")).collect();
    let settings: Vec<String> = STEP_SETTINGS
        .iter()
        .map(|s| format!("SET {}", s.replacen('=', " = ", 1)))
        .collect();
    STEPS
        .replace("{SETTINGS}", &settings.join(" "))
        .replace("{PURGE}", PURGE)
        .replace("{SWEEP}", SWEEP)
        .replace("{TIMELINE}", TIMELINE)
        .replace("{MAX_TIMELINE}", &MAX_TIMELINE.to_string())
        .replace("{SEQ_BITS}", &SEQ_BITS.to_string())
        .replace("{ENQUEUE_LIMIT}", &ENQUEUE_LIMIT.to_string())
        .replace("{ADVISORY_CLASS}", &ADVISORY_CLASS.to_string())
        .replace("{FAST_KINDS}", &kinds.join(", "))
}

/// The functions of [`STEPS`] a client calls, by their signatures.
const STEP_FUNCTIONS: [&str; 2] = [
    "{s}.enqueue_3(text,uuid,uuid,text,integer,bytea,boolean)",
    "{s}.remove_3(text,uuid)",
];

/// Whether the functions of [`STEPS`] exist, and whether they carry
/// every setting they are made with now ([`STEP_SETTINGS`]): a schema
/// made by an earlier version has them without `enable_bitmapscan = off`
/// or `plan_cache_mode = force_generic_plan`, and a client replaces them
/// (the same steps: a client of that version still runs them the same
/// way). Two booleans.
fn steps_exist_and_current() -> String {
    let procs = STEP_FUNCTIONS.map(|f| format!("to_regprocedure('{f}')"));
    let settings: Vec<String> = STEP_SETTINGS.iter().map(|s| format!("'{s}'")).collect();
    format!(
        "({} IS NOT NULL), (NOT EXISTS (SELECT 1 FROM pg_proc p WHERE p.oid IN ({}) \
         AND NOT COALESCE(p.proconfig, '{{}}') @> ARRAY[{}]))",
        procs.join(" IS NOT NULL AND "),
        procs.join(", "),
        settings.join(", ")
    )
}

/// The error a [`STEPS`] function raised (`QLTOK`) with `message`: the
/// same as the transactions give ([`token`], [`check_enqueue`]).
pub(crate) fn raised(message: &str) -> Error {
    let mut words = message.split(' ');
    let (what, a, b) = (words.next(), words.next(), words.next());
    let numbers = a.and_then(|a| Some((a.parse::<i64>().ok()?, b?.parse::<i64>().ok()?)));
    let checked = match (what, numbers) {
        (Some("token"), Some((t, tl))) => token(t, tl).map(drop),
        (Some("enqueue"), Some((seq, tl))) => check_enqueue(seq, tl),
        _ => Ok(()),
    };
    checked.err().unwrap_or_else(|| {
        Error::new(
            ErrorKind::Internal,
            format!("a lock function refused a step with {message:?}, which fits"),
        )
    })
}

/// Whether every object of [`SCHEMA`] exists, from the catalog alone:
/// no lock on the tables. Checked before [`SCHEMA`] runs, because its
/// `CREATE INDEX IF NOT EXISTS` takes a SHARE lock on an existing table
/// before it finds the index there: a client starting while another
/// transaction wrote the table waited behind it, and every later writer
/// behind the new client. The objects are read off [`SCHEMA`] itself.
/// Answers four booleans: the tables, the [`TRIGGER`] (no relation:
/// read from `pg_trigger`), the functions of [`STEPS`], and whether
/// those are current ([`steps_exist_and_current`]).
fn schema_exists() -> String {
    let checks: Vec<String> = schema_objects()
        .iter()
        .map(|o| format!("to_regclass('{o}') IS NOT NULL"))
        .collect();
    format!(
        "SELECT {}, {TRIGGER_EXISTS}, {}",
        checks.join(" AND "),
        steps_exist_and_current()
    )
}

/// Whether the [`TRIGGER`]s are on the entries and sessions tables,
/// with their table of followers: else a client adds what is missing.
const TRIGGER_EXISTS: &str = "(EXISTS (SELECT 1 FROM pg_trigger \
     WHERE tgname = 'entries_changed' AND tgrelid = to_regclass('{s}.entries')) \
     AND EXISTS (SELECT 1 FROM pg_trigger \
     WHERE tgname = 'session_renewed' AND tgrelid = to_regclass('{s}.sessions')) \
     AND to_regclass('{s}.followers') IS NOT NULL)";

/// Whether a follower can hear changes: `entries_changed` and the
/// followers' table (without `session_renewed`, as on a schema its user
/// may not upgrade, it reads each expiry when it is due).
const CHANGES_TRIGGER_EXISTS: &str = "(EXISTS (SELECT 1 FROM pg_trigger \
     WHERE tgname = 'entries_changed' AND tgrelid = to_regclass('{s}.entries')) \
     AND to_regclass('{s}.followers') IS NOT NULL)";

/// The sequence, tables and indexes [`SCHEMA`] creates, as `{s}.name`
/// (an index lives in its table's schema).
fn schema_objects() -> Vec<String> {
    SCHEMA
        .split("IF NOT EXISTS ")
        .skip(1)
        .filter_map(|rest| {
            let name = rest.split([' ', ';', '\n', '(']).next()?;
            match name {
                "{s}" => None,
                n if n.starts_with("{s}.") => Some(n.to_string()),
                n => Some(format!("{{s}}.{n}")),
            }
        })
        .collect()
}

/// The statements, with the schema filled in.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) schema: String,
    pub(crate) trigger: String,
    pub(crate) schema_exists: String,
    pub(crate) trigger_exists: String,
    /// `$1`: the lock key. Serialises every transaction that reads and
    /// changes one queue.
    pub(crate) lock_queue: String,
    /// `$1`: lock. Removes the entries whose session is dead.
    pub(crate) purge: String,
    /// Removes expired sessions that own no entry any more, and fences
    /// of sessions that are gone.
    pub(crate) sweep: String,
    /// The functions of [`STEPS`].
    pub(crate) steps: String,
    /// `$1..$7`: lock, contender, session, kind, permits, value, wait.
    /// One acquire's step where [`STEPS`] decides it: `slow`, `dead`,
    /// `fenced`, `busy` (would wait), `held` with the token, `wait` with
    /// when the session ahead expires unless renewed (ms).
    pub(crate) enqueue_step: String,
    /// `$1`: lock, `$2`: contender. One removal's step where [`STEPS`]
    /// decides it: how many entries it removed (0 or 1), or null for
    /// `slow`.
    pub(crate) remove_step: String,
    /// `$1`: contender. Its token, if it holds and its session lives, read
    /// on a primary (a standby's copy may be behind a break).
    pub(crate) held: String,
    /// `$1`: lock. The queue in arrival order, each entry with the
    /// remaining life of its session in ms.
    pub(crate) queue: String,
    /// `$1`: contender. Grants it: its token, the timeline shifted above
    /// the sequence's next value; answers the token and the timeline
    /// ([`token`] checks them).
    pub(crate) grant: String,
    /// `$1`: sessions, `$2`: messages. One notification each.
    pub(crate) notify: String,
    /// `$1`: session. Alive (and kept from being swept until commit).
    pub(crate) session_alive: String,
    /// `$1`: contender.
    pub(crate) fenced: String,
    /// `$1..$6`: lock, contender, session, kind, permits, value; answers
    /// the arrival value and the timeline ([`check_enqueue`]).
    pub(crate) insert: String,
    /// `$1`: contender.
    pub(crate) delete_contender: String,
    /// `$1`: contender, `$2`: session.
    pub(crate) fence: String,
    /// `$1`: session, `$2`: prefix, `$3`: TTL in ms.
    pub(crate) open_session: String,
    /// `$1`: session, `$2`: held contenders.
    pub(crate) renew: String,
    /// `$1`: session. Deletes its row.
    pub(crate) end_session: String,
    /// `$1`: session. Deletes its fences.
    pub(crate) end_fences: String,
    /// `$1`: session. Deletes its entries, answering their locks.
    pub(crate) end_entries: String,
    /// `$1`: contender, `$2`: token, `$3`: value.
    pub(crate) set_value: String,
    /// `$1`: contenders, `$2`: tokens. Locks every held entry and its
    /// session against removal until commit; answers how many hold.
    pub(crate) check_held: String,
    pub(crate) kv_get: String,
    pub(crate) kv_put: String,
    pub(crate) kv_delete: String,
    /// `$1`: lock. Every holder, deleted.
    pub(crate) break_holders: String,
    /// `$1`: lock. Every holder, marked.
    pub(crate) revoke_holders: String,
    /// `$1`: prefix of lock keys (LIKE pattern).
    pub(crate) locks_like: String,
    /// `$1`: prefix of lock keys (LIKE pattern).
    pub(crate) entries_like: String,
    /// `$1`: prefix of lock keys (LIKE pattern). The locks with an entry
    /// of a dead session.
    pub(crate) dead_like: String,
    /// `$1`: sessions.
    pub(crate) sessions_left: String,
    /// `$1`: lock. The channel its changes are notified on.
    pub(crate) follow_channel: String,
    /// `$1`: lock. Makes this backend (connection) a follower of the
    /// lock, and removes the rows of followers whose backend is gone.
    pub(crate) follow: String,
    /// `$1`: lock. Each session owning one of its entries (as text, as
    /// the `session_renewed` trigger names it) and in ms when it expires
    /// unless renewed: 0 if it is dead already.
    pub(crate) session_expiries: String,
}

impl Sql {
    pub(crate) fn new(schema: &str) -> Sql {
        let s = format!("\"{schema}\"");
        let f = |t: &str| t.replace("{s}", &s);
        Sql {
            schema: f(SCHEMA),
            trigger: f(TRIGGER),
            schema_exists: f(&schema_exists()),
            trigger_exists: f(&format!("SELECT {CHANGES_TRIGGER_EXISTS}")),
            lock_queue: format!("SELECT pg_advisory_xact_lock({ADVISORY_CLASS}, hashtext($1))"),
            purge: f(PURGE),
            sweep: f(SWEEP),
            steps: f(&steps()),
            enqueue_step: f("SELECT outcome, granted, ahead_ms \
                 FROM {s}.enqueue_3($1, $2, $3, $4, $5, $6, $7)"),
            remove_step: f("SELECT {s}.remove_3($1, $2)"),
            held: f("SELECT e.token FROM {s}.entries e JOIN {s}.sessions s ON s.id = e.session \
                 WHERE e.contender = $1 AND e.token IS NOT NULL AND s.expires > clock_timestamp() \
                 AND NOT pg_is_in_recovery()"),
            queue: f("SELECT e.seq, e.contender, e.session, e.kind, e.permits, e.token, e.created, \
                   e.value, e.revoke, \
                   COALESCE((extract(epoch FROM (s.expires - clock_timestamp())) * 1000)::bigint, 0) \
                 FROM {s}.entries e LEFT JOIN {s}.sessions s ON s.id = e.session \
                 WHERE e.lock = $1 ORDER BY e.seq"),
            grant: f(&format!("WITH t AS (SELECT {TIMELINE} AS tl) \
                 UPDATE {{s}}.entries e SET token = (t.tl << {SEQ_BITS}) + nextval('{{s}}.seq') \
                 FROM t WHERE e.contender = $1 AND e.token IS NULL RETURNING e.token, t.tl")),
            notify: "SELECT pg_notify('ql_' || replace(t.s::text, '-', ''), t.m) \
                 FROM unnest($1::uuid[], $2::text[]) AS t(s, m)"
                .to_string(),
            session_alive: f("SELECT 1 FROM {s}.sessions WHERE id = $1 \
                 AND expires > clock_timestamp() FOR KEY SHARE"),
            fenced: f("SELECT 1 FROM {s}.fences WHERE contender = $1"),
            insert: f("INSERT INTO {s}.entries (lock, seq, contender, session, kind, permits, value) \
                 VALUES ($1, nextval('{s}.seq'), $2, $3, $4, $5, $6) RETURNING seq, {TIMELINE}")
                .replace("{TIMELINE}", TIMELINE),
            delete_contender: f("DELETE FROM {s}.entries WHERE contender = $1"),
            fence: f("INSERT INTO {s}.fences (contender, session) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING"),
            open_session: f("INSERT INTO {s}.sessions (id, prefix, ttl_ms, expires) \
                 VALUES ($1, $2, $3::bigint, clock_timestamp() + $3::bigint::float8 * interval '1 millisecond')"),
            renew: f("WITH r AS (UPDATE {s}.sessions \
                   SET expires = clock_timestamp() + ttl_ms::float8 * interval '1 millisecond' \
                   WHERE id = $1 AND expires > clock_timestamp() RETURNING 1) \
                 SELECT (SELECT count(*) FROM r)::int4, \
                   ARRAY(SELECT c FROM unnest($2::uuid[]) c WHERE NOT EXISTS \
                     (SELECT 1 FROM {s}.entries e WHERE e.contender = c AND e.token IS NOT NULL)), \
                   ARRAY(SELECT e.contender FROM {s}.entries e \
                     WHERE e.contender = ANY($2::uuid[]) AND e.revoke)"),
            end_session: f("DELETE FROM {s}.sessions WHERE id = $1"),
            end_fences: f("DELETE FROM {s}.fences WHERE session = $1"),
            end_entries: f("DELETE FROM {s}.entries WHERE session = $1 RETURNING lock"),
            set_value: f("UPDATE {s}.entries SET value = $3 WHERE contender = $1 AND token = $2 \
                 AND EXISTS (SELECT 1 FROM {s}.sessions s WHERE s.id = session \
                   AND s.expires > clock_timestamp())"),
            check_held: f("SELECT count(*)::int4 FROM (SELECT 1 FROM {s}.entries e \
                   JOIN {s}.sessions s ON s.id = e.session \
                   JOIN unnest($1::uuid[], $2::int8[]) AS h(c, t) ON e.contender = h.c AND e.token = h.t \
                   WHERE s.expires > clock_timestamp() FOR KEY SHARE OF e, s) held"),
            kv_get: f("SELECT value FROM {s}.kv WHERE key = $1"),
            kv_put: f("INSERT INTO {s}.kv (key, value) VALUES ($1, $2) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value"),
            kv_delete: f("DELETE FROM {s}.kv WHERE key = $1"),
            break_holders: f("DELETE FROM {s}.entries WHERE lock = $1 AND token IS NOT NULL \
                 RETURNING session, contender"),
            revoke_holders: f("UPDATE {s}.entries SET revoke = true \
                 WHERE lock = $1 AND token IS NOT NULL RETURNING session, contender"),
            locks_like: f("SELECT DISTINCT lock FROM {s}.entries WHERE lock LIKE $1 ORDER BY lock"),
            entries_like: f("SELECT lock, contender FROM {s}.entries WHERE lock LIKE $1"),
            dead_like: f("SELECT DISTINCT e.lock FROM {s}.entries e WHERE e.lock LIKE $1 \
                 AND NOT EXISTS (SELECT 1 FROM {s}.sessions s WHERE s.id = e.session \
                   AND s.expires > clock_timestamp())"),
            follow_channel: "SELECT 'qlc_' || md5($1::text)".to_string(),
            follow: f("WITH gone AS (DELETE FROM {s}.followers f WHERE NOT EXISTS \
                   (SELECT 1 FROM pg_stat_activity a WHERE a.pid = f.pid)) \
                 INSERT INTO {s}.followers (lock, pid) VALUES ($1, pg_backend_pid()) \
                 ON CONFLICT DO NOTHING"),
            session_expiries: f("SELECT e.session::text, min(GREATEST(COALESCE( \
                   (extract(epoch FROM (s.expires - clock_timestamp())) * 1000)::bigint, 0), 0)) \
                 FROM {s}.entries e LEFT JOIN {s}.sessions s ON s.id = e.session WHERE e.lock = $1 \
                 GROUP BY e.session"),
            sessions_left: f("SELECT id FROM {s}.sessions WHERE id = ANY($1) \
                 AND expires > clock_timestamp() \
                 UNION SELECT session FROM {s}.fences WHERE session = ANY($1)"),
        }
    }
}

/// The fencing token of a grant whose statement answered `token` and
/// `timeline`: refused (the transaction rolls back, nothing granted) if
/// the timeline does not fit above the sequence (beyond
/// [`MAX_TIMELINE`]), or the sequence's value reached 2^40 (it would run
/// into the timeline's bits: tokens would no longer grow), rather than
/// wrap.
pub(crate) fn token(token: i64, timeline: i64) -> Result<u64> {
    check_timeline(timeline)?;
    if token >> SEQ_BITS != timeline {
        return Err(exhausted(token - (timeline << SEQ_BITS)));
    }
    Ok(token as u64)
}

/// Checks an enqueue's arrival value `seq` and the server's `timeline`:
/// refused once the sequence reached [`ENQUEUE_LIMIT`] (the rest is for
/// the grants of entries already queued) or the timeline is beyond
/// [`MAX_TIMELINE`].
pub(crate) fn check_enqueue(seq: i64, timeline: i64) -> Result<()> {
    check_timeline(timeline)?;
    if !(0..ENQUEUE_LIMIT).contains(&seq) {
        return Err(exhausted(seq));
    }
    Ok(())
}

fn check_timeline(timeline: i64) -> Result<()> {
    if (1..=MAX_TIMELINE).contains(&timeline) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Store,
        format!(
            "the server's timeline {timeline} does not fit in a fencing token \
             (timeline << {SEQ_BITS} | sequence, timelines 1 to {MAX_TIMELINE}): \
             refused rather than giving a token that does not grow"
        ),
    ))
}

fn exhausted(value: i64) -> Error {
    Error::new(
        ErrorKind::Store,
        format!(
            "the lock tables' sequence is at {value}, near or past 2^{SEQ_BITS}, where fencing \
             tokens (timeline << {SEQ_BITS} | sequence) would stop growing: refused rather \
             than wrapped. New tokens need a new timeline (a promotion or a point-in-time \
             recovery) and then the sequence restarted (ALTER SEQUENCE <schema>.seq RESTART)"
        ),
    )
}

/// Checks a schema name: 1 to 40 of `a-z`, `0-9` and `_`, not starting
/// with a digit (it is quoted into statements).
pub(crate) fn check_schema(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 40
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::InvalidArgument,
        format!(
            "schema={schema:?}: a schema name here is 1 to 40 of a-z, 0-9 and _, \
             not starting with a digit"
        ),
    ))
}

/// The LIKE pattern of every text starting with `prefix`.
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut p = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// The entry name of `contender` on lock `lock`: `<lock>/.q/<contender>`
/// (no lock name has a `.` segment, so no name is another's entry).
pub(crate) fn entry_name(lock: &str, contender: &Uuid) -> String {
    format!("{lock}/.q/{}", contender.simple())
}

/// The lock and contender of an entry name.
pub(crate) fn parse_entry_name(entry: &str) -> Result<(&str, Uuid)> {
    entry
        .rsplit_once("/.q/")
        .and_then(|(lock, c)| Some((lock, Uuid::try_parse(c).ok()?)))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{entry:?} is not a PostgreSQL lock entry"),
            )
        })
}

/// A new session's id: random, as a UUID of version 8 (RFC 9562's
/// custom version), which tells the step functions of [`STEPS`] that
/// the session reads the token of a grant from its message
/// ([`grant_message`]). A session of an older client has a version 4 id
/// and is told `g <contender>` alone, so both share a schema.
pub(crate) fn session_id() -> Uuid {
    uuid::Builder::from_custom_bytes(Uuid::new_v4().into_bytes()).into_uuid()
}

/// A grant's message on its session's channel: `g <contender>`, and
/// ` <token>` when the step that granted knew it. `None` for any other
/// message. A grant message with anything else after the contender (a
/// later version's form) still wakes the waiter, without a token: it
/// reads.
pub(crate) fn grant_message(msg: &str) -> Option<(Uuid, Option<u64>)> {
    let mut words = msg.strip_prefix("g ")?.split(' ');
    let contender = Uuid::try_parse(words.next()?).ok()?;
    let token = match (words.next(), words.next()) {
        (Some(t), None) => t.parse::<u64>().ok(),
        _ => None,
    };
    Some((contender, token))
}

/// The channel a session listens on: `ql_<session, 32 hex digits>`.
pub(crate) fn channel(session: &Uuid) -> String {
    format!("ql_{}", session.simple())
}

/// The stored `(kind, permits)` of a lock kind.
pub(crate) fn kind_code(kind: LockKind) -> (&'static str, i32) {
    match kind {
        LockKind::Read => ("r", 0),
        LockKind::Write => ("w", 0),
        LockKind::Upgradeable => ("u", 0),
        LockKind::Upgrade => (UPGRADE, 0),
        LockKind::Semaphore { permits } => ("s", permits.min(i32::MAX as u32) as i32),
        LockKind::Election => ("e", 0),
        _ => ("x", 0),
    }
}

/// The stored kind of an upgrade: `g`, then the contender (32 hex digits)
/// of the upgradeable entry it upgrades ([`upgrade_code`]).
pub(crate) const UPGRADE: &str = "g";

/// The stored kind of an upgrade of the upgradeable entry of `of`.
pub(crate) fn upgrade_code(of: &Uuid) -> String {
    format!("{UPGRADE}{}", of.simple())
}

/// The contender whose upgradeable entry an entry of stored kind `code`
/// upgrades, if it is an upgrade.
pub(crate) fn upgraded(code: &str) -> Option<Uuid> {
    Uuid::try_parse(code.strip_prefix(UPGRADE)?).ok()
}

/// The stored kind of a permit entry that more entries of its request
/// follow (a request for several permits at once is its entries side by
/// side: `s+` for each but the last, `s` for the last).
pub(crate) const MORE_PERMITS: &str = "s+";

/// The contender of the `j`-th entry (1-based, before the last) of a
/// request for several permits whose last entry is `contender`'s.
pub(crate) fn permit_contender(contender: Uuid, j: u32) -> Uuid {
    Uuid::from_u128(contender.as_u128() ^ u128::from(j))
}

/// Every contender of a request for `count` permits (its last `contender`).
pub(crate) fn request_contenders(contender: Uuid, count: u32) -> Vec<Uuid> {
    (1..count)
        .map(|j| permit_contender(contender, j))
        .chain([contender])
        .collect()
}

/// The lock kind of a stored `(kind, permits)`.
pub(crate) fn kind_of(code: &str, permits: i32) -> LockKind {
    match code {
        "r" => LockKind::Read,
        "w" => LockKind::Write,
        "u" => LockKind::Upgradeable,
        c if upgraded(c).is_some() => LockKind::Upgrade,
        "s" | MORE_PERMITS => LockKind::Semaphore {
            permits: permits.max(0) as u32,
        },
        "e" => LockKind::Election,
        _ => LockKind::Exclusive,
    }
}

/// A session id as [`quorumlock_core::backend::StoreSession::id`] gives
/// it (32 hex digits), checked.
pub(crate) fn parse_session_id(id: &str) -> Result<Uuid> {
    match Uuid::try_parse(id) {
        Ok(u) if id.len() == 32 => Ok(u),
        _ => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{id:?} is not a PostgreSQL session id of this backend (32 hex digits)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The existence check names every object the schema creates.
    #[test]
    fn the_existence_check_covers_the_schema() {
        assert_eq!(
            schema_objects(),
            [
                "{s}.seq",
                "{s}.sessions",
                "{s}.sessions_expires",
                "{s}.entries",
                "{s}.entries_session",
                "{s}.fences",
                "{s}.fences_session",
                "{s}.kv"
            ]
        );
    }

    #[test]
    fn names_round_trip() {
        let c = Uuid::new_v4();
        let e = entry_name("app/a/~42", &c);
        assert_eq!(parse_entry_name(&e).unwrap(), ("app/a/~42", c));
        assert!(parse_entry_name("app/a").is_err());
        for k in [
            LockKind::Exclusive,
            LockKind::Read,
            LockKind::Write,
            LockKind::Election,
            LockKind::Upgradeable,
            LockKind::Semaphore { permits: 3 },
        ] {
            let (code, permits) = kind_code(k);
            assert_eq!(kind_of(code, permits), k);
        }
        let upgrade = upgrade_code(&c);
        assert_eq!(kind_of(&upgrade, 0), LockKind::Upgrade);
        assert_eq!(upgraded(&upgrade), Some(c));
        assert_eq!(upgraded("u"), None);
        assert_eq!(kind_of("g", 0), LockKind::Exclusive, "an upgrade of nobody");
        assert_eq!(like_prefix("a_b%/"), "a\\_b\\%/%");
        let s = Uuid::new_v4();
        assert_eq!(parse_session_id(&s.simple().to_string()).unwrap(), s);
        assert!(parse_session_id(&s.to_string()).is_err());
        assert_eq!(channel(&s).len(), 35);
    }

    /// A session id says it reads tokens from grant messages in the
    /// character the step functions look at (`substr(id::text, 15, 1)`);
    /// grant messages of both forms parse, one of another form wakes
    /// without a token, and nothing else is a grant.
    #[test]
    fn session_ids_and_grant_messages() {
        let (a, b) = (session_id(), session_id());
        assert_ne!(a, b);
        assert_eq!(a.get_version_num(), 8);
        assert_eq!(a.to_string().chars().nth(14), Some('8'));
        assert_ne!(Uuid::new_v4().to_string().chars().nth(14), Some('8'));
        let c = Uuid::new_v4();
        let old = format!("g {}", c.simple());
        assert_eq!(grant_message(&old), Some((c, None)));
        assert_eq!(grant_message(&format!("{old} 42")), Some((c, Some(42))));
        for other in [
            format!("{old} -1"),
            format!("{old} 42 7"),
            format!("{old} "),
        ] {
            assert_eq!(grant_message(&other), Some((c, None)), "{other:?}");
        }
        for bad in [format!("l {}", c.simple()), "g".into(), "g nope".into()] {
            assert_eq!(grant_message(&bad), None, "{bad:?}");
        }
    }

    /// The server's steps decide a queue by a window: in a queue of
    /// entries of one window alone, entry `i` holds when `i < w`, else
    /// waits for the entry `w` places ahead, by the shared rule. Readers,
    /// upgrades and requests of several permits have none.
    #[test]
    fn the_window_is_the_queue_rule() {
        let mutex_like: Vec<(&str, i32)> = FAST_KINDS.iter().map(|&c| (c, 0)).collect();
        let groups = [mutex_like, vec![("s", 1)], vec![("s", 2)], vec![("s", 3)]];
        for group in groups {
            let w = fast_window(group[0].0, group[0].1).unwrap();
            assert!(group.iter().all(|&(c, p)| fast_window(c, p) == Some(w)));
            let kinds_of_window: Vec<LockKind> =
                group.iter().map(|&(c, p)| kind_of(c, p)).collect();
            // Every queue of up to 4 entries of those kinds.
            let mut queues: Vec<Vec<LockKind>> = vec![Vec::new()];
            for _ in 0..4 {
                queues = queues
                    .iter()
                    .flat_map(|q| {
                        kinds_of_window.iter().map(move |&k| {
                            let mut q = q.clone();
                            q.push(k);
                            q
                        })
                    })
                    .collect();
                for q in &queues {
                    for i in 0..q.len() {
                        assert_eq!(
                            quorumlock_core::backend::waits_for(q, i),
                            i.checked_sub(w),
                            "{q:?} entry {i}"
                        );
                    }
                }
            }
        }
        for (code, permits) in [("r", 0), ("s+", 2), (UPGRADE, 0)] {
            assert_eq!(fast_window(code, permits), None, "{code}");
        }
        assert_eq!(fast_window(&upgrade_code(&Uuid::new_v4()), 0), None);
    }

    #[test]
    fn tokens_carry_the_timeline_and_refuse_to_wrap() {
        let t = 1 << SEQ_BITS;
        assert_eq!(token(t + 7, 1).unwrap(), (t + 7) as u64);
        assert_eq!(token(2 * t + 1, 2).unwrap(), (2 * t + 1) as u64);
        // A later timeline's token is above every token of the ones before.
        assert!(token(2 * t + 1, 2).unwrap() > token(2 * t - 1, 1).unwrap());
        // The sequence at 2^40: the sum went into the timeline's bits.
        let e = token(2 * t, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Store);
        assert!(e.to_string().contains("refused rather than wrapped"), "{e}");
        // Timelines that do not fit.
        assert!(token(5, 0).is_err());
        assert!(token(5, MAX_TIMELINE + 1).is_err());
        assert_eq!(
            token((MAX_TIMELINE << SEQ_BITS) + 3, MAX_TIMELINE).unwrap(),
            ((MAX_TIMELINE << SEQ_BITS) + 3) as u64
        );
        // Enqueues stop 2^32 values early.
        assert!(check_enqueue(1, 1).is_ok());
        assert!(check_enqueue(ENQUEUE_LIMIT - 1, 1).is_ok());
        assert!(check_enqueue(ENQUEUE_LIMIT, 1).is_err());
        assert!(check_enqueue(1, MAX_TIMELINE + 1).is_err());
    }
}
