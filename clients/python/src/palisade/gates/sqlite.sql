-- Palisade fence table for SQLite (palisade_adapters::sqlite::MIGRATION).
--
-- One row per lock: the largest (epoch, seq) this database has admitted for it, its
-- high-water mark. Rows are written only by palisade_adapters::sqlite::admit, inside the
-- same transaction as the writes the token guards. Never lower or delete a row: a
-- database that forgets its mark accepts old holders again (S11).
CREATE TABLE IF NOT EXISTS palisade_fence (
    lock_name  TEXT    PRIMARY KEY NOT NULL,
    epoch      INTEGER NOT NULL CHECK (typeof(epoch) = 'integer' AND epoch >= 0),
    seq        INTEGER NOT NULL DEFAULT 0 CHECK (typeof(seq) = 'integer' AND seq >= 0),
    updated_at INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER))
);
