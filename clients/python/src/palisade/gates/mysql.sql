-- Palisade fence table for MySQL and MariaDB (palisade_adapters::mysql::MIGRATION).
--
-- One row per lock: the largest (epoch, seq) this database has admitted for it, its
-- high-water mark. Rows are written only by palisade_adapters::mysql::admit, inside the
-- same InnoDB transaction as the writes the token guards. Never lower or delete a row: a
-- database that forgets its mark accepts old holders again (S11). Restore this table only
-- together with the data it guards. InnoDB (transactional, row locks); lock names compare
-- byte for byte (a binary collation: "Orders" is not "orders").
CREATE TABLE IF NOT EXISTS palisade_fence (
    lock_name  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    epoch      BIGINT      NOT NULL,
    seq        BIGINT      NOT NULL DEFAULT 0,
    updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT palisade_fence_lock_name CHECK (lock_name REGEXP '^[A-Za-z0-9._-]{1,128}$'),
    CONSTRAINT palisade_fence_epoch CHECK (epoch >= 0),
    CONSTRAINT palisade_fence_seq CHECK (seq >= 0)
) ENGINE = InnoDB
