-- Palisade fence table for PostgreSQL (palisade_adapters::postgres::MIGRATION).
--
-- One row per lock: the largest (epoch, seq) this database has admitted for it, its
-- high-water mark. Rows are written only by palisade_adapters::postgres::admit, inside
-- the same transaction as the writes the token guards. Never lower or delete a row: a
-- database that forgets its mark accepts old holders again (S11). Restore this table
-- only together with the data it guards.
CREATE TABLE IF NOT EXISTS palisade_fence (
    lock_name  text        PRIMARY KEY
                           CHECK (lock_name ~ '^[A-Za-z0-9._-]{1,128}$'),
    epoch      bigint      NOT NULL CHECK (epoch >= 0),
    seq        bigint      NOT NULL DEFAULT 0 CHECK (seq >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
