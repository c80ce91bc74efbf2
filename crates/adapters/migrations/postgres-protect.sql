-- Palisade in-database enforcement for PostgreSQL (palisade_adapters::postgres::PROTECTION,
-- installed by `palisade admin protect`). Idempotent.
--
-- A protected table refuses every INSERT, UPDATE, DELETE and TRUNCATE unless a gate has
-- admitted a token for the table's lock earlier in the same transaction. Every gate (Rust,
-- Python, Go, Java, TypeScript) ends a successful admit by writing the lock's row of
-- palisade_fence; the trigger below notes that lock in a transaction-local setting, which
-- PostgreSQL forgets when the transaction ends (or the savepoint around the admit is
-- rolled back). So a writer that skips the gate, a maintenance script, a second service
-- or a psql session, is refused by PostgreSQL itself, with the lock named; and an admit is
-- never reused by a later transaction.
--
-- Not access control: a session allowed to UPDATE palisade_fence can note a lock without
-- a token. Grant UPDATE on palisade_fence only to the roles that write through a gate.

CREATE OR REPLACE FUNCTION palisade_note_admit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config(
        'palisade.admitted',
        coalesce(current_setting('palisade.admitted', true), '') || '|' || NEW.lock_name || '|',
        true);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS palisade_note_admit ON palisade_fence;
CREATE TRIGGER palisade_note_admit AFTER UPDATE ON palisade_fence
    FOR EACH ROW EXECUTE FUNCTION palisade_note_admit();

-- The guard of a protected table; its one argument is the table's lock.
CREATE OR REPLACE FUNCTION palisade_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF position('|' || TG_ARGV[0] || '|'
                IN coalesce(current_setting('palisade.admitted', true), '')) = 0 THEN
        RAISE EXCEPTION 'palisade: % on % needs a fencing token admitted for lock "%" earlier in the same transaction',
            TG_OP, TG_TABLE_NAME, TG_ARGV[0]
            USING HINT = 'write through a Palisade gate (admit, then write, in one transaction)';
    END IF;
    RETURN NULL;
END
$$;

-- Protects `target` with the lock `lock`: installs (or replaces) its guard.
CREATE OR REPLACE FUNCTION palisade_protect(target regclass, lock text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF lock IS NULL OR lock !~ '^[A-Za-z0-9._-]{1,128}$' THEN
        RAISE EXCEPTION 'palisade: % is not a lock name', coalesce(quote_literal(lock), 'NULL');
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard ON %s', target);
    EXECUTE format('CREATE TRIGGER palisade_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION palisade_guard(%L)', target, lock);
END
$$;

-- Removes `target`'s guard; its writes are no longer checked.
CREATE OR REPLACE FUNCTION palisade_unprotect(target regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS palisade_guard ON %s', target);
END
$$;
