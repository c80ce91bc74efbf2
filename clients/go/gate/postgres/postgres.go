// Package postgres is the gate inside a PostgreSQL transaction (pgx v5), sharing
// palisade_fence and its rules with the Rust palisade_adapters::postgres and the Python
// palisade.gates.postgres, so writers in every language can guard one database together.
//
//	err := postgres.Migrate(ctx, pool)   // at deploy time: checks the settings, creates the table
//	err = postgres.Preflight(ctx, pool)  // at every start of the application
//	tx, err := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	if _, err := postgres.Admit(ctx, tx, verifier, tok, "orders"); err != nil {
//		return err // *palisade.StaleTokenError when a newer holder wrote first
//	}
//	_, err = tx.Exec(ctx, "UPDATE orders SET state = 'shipped' WHERE id = $1", 42)
//	err = tx.Commit(ctx)
//
// How it serialises: Admit locks the lock's row of palisade_fence with SELECT ... FOR
// UPDATE (creating it first with INSERT ... ON CONFLICT DO NOTHING when the database has
// never seen the lock). A second transaction admitting for the same lock, in any
// language, waits on that row lock until the first commits or rolls back, then reads the
// mark it left. Admits for different locks do not wait on each other. Under REPEATABLE
// READ or SERIALIZABLE, PostgreSQL refuses to lock a row changed after the snapshot was
// taken: that is *gate.ConflictError; roll back and retry.
//
// A refusal poisons the transaction: when Admit returns an error it has also raised one
// inside PostgreSQL, which marks the transaction aborted, so every later statement fails
// and COMMIT becomes a rollback. Writes the caller made before Admit can never commit
// alongside a refused token, even if the caller ignores the error. (A savepoint rolled
// back to after the refusal would clear that state: do not admit inside a savepoint you
// then roll back to and carry on.)
package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/palisade/palisade-go/gate"
	"github.com/palisade/palisade-go/token"
)

// Migration is the SQL that creates the fence table: a copy of
// crates/adapters/migrations/postgres.sql (a test keeps the two equal).
//
//go:embed postgres.sql
var Migration string

const (
	selectMark = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = $1"
	lockMark   = selectMark + " FOR UPDATE"
	createMark = "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES ($1, 0, 0) " +
		"ON CONFLICT (lock_name) DO NOTHING"
	storeMark = "UPDATE palisade_fence SET epoch = $1, seq = $2, updated_at = now() WHERE lock_name = $3"
	// Raising an error is how a refusal is made final: PostgreSQL will not commit a
	// transaction that saw one.
	poison = "DO $$ BEGIN RAISE EXCEPTION 'palisade: fenced operation refused; roll back'; END $$"
)

// Execer runs a statement: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier reads a row: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DB runs statements and reads rows: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type DB interface {
	Execer
	Querier
}

// Migrate checks the database's settings (Preflight), then creates the fence table if it
// does not exist (idempotent). Run it once at deploy time, not concurrently from many
// processes.
func Migrate(ctx context.Context, db DB) error {
	if err := Preflight(ctx, db); err != nil {
		return err
	}
	return MigrateUnchecked(ctx, db)
}

// MigrateUnchecked is Migrate without the settings check: for a database whose
// durability is ensured some other way, and for tests on a throwaway database.
func MigrateUnchecked(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, Migration); err != nil {
		return dbError(err)
	}
	return nil
}

// Admit admits tok for lock inside tx under the epoch policy: an equal or larger epoch
// passes and raises the mark, a smaller one is refused with *palisade.StaleTokenError. On
// success the new mark is part of tx and commits or rolls back with the caller's writes;
// on any error tx is aborted and must be rolled back.
func Admit(ctx context.Context, tx pgx.Tx, verifier *token.Verifier, tok, lock string) (gate.Admitted, error) {
	return admit(ctx, tx, verifier, tok, lock, gate.Epoch, 0)
}

// AdmitSequenced is Admit under the sequence policy: (epoch, seq) must strictly exceed
// the mark, so a delayed or replayed operation of the current holder is refused too
// (*palisade.StaleSequenceError). Use one policy per lock: an epoch-policy admit resets
// the stored sequence to 0.
func AdmitSequenced(ctx context.Context, tx pgx.Tx, verifier *token.Verifier, tok, lock string, seq uint64) (gate.Admitted, error) {
	return admit(ctx, tx, verifier, tok, lock, gate.Sequence, seq)
}

// HighWater is the lock's committed mark as db sees it ((0, 0) if never admitted). For
// inspection only: deciding on it outside the transaction that writes would re-open the
// check-then-write race (S6).
func HighWater(ctx context.Context, db Querier, lock string) (gate.HighWater, error) {
	var epoch, seq int64
	err := db.QueryRow(ctx, selectMark, lock).Scan(&epoch, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return gate.HighWater{}, nil
	}
	if err != nil {
		return gate.HighWater{}, dbError(err)
	}
	return gate.FromSQL(epoch, seq)
}

func admit(ctx context.Context, tx pgx.Tx, verifier *token.Verifier, tok, lock string, policy gate.Policy, seq uint64) (gate.Admitted, error) {
	admitted, err := steps(ctx, tx, verifier, tok, lock, policy, seq)
	if err != nil {
		// Any refusal, or a failure of the gate's own statements, aborts the
		// transaction. The poison's own error is the point; if the connection is gone,
		// the transaction cannot commit anyway.
		_, _ = tx.Exec(ctx, poison)
		return gate.Admitted{}, err
	}
	return admitted, nil
}

// steps: verify, lock the mark's row (creating it first if missing), decide, store.
func steps(ctx context.Context, tx pgx.Tx, verifier *token.Verifier, tok, lock string, policy gate.Policy, seq uint64) (gate.Admitted, error) {
	claims, err := gate.VerifyForLock(verifier, tok, lock)
	if err != nil {
		return gate.Admitted{}, err
	}
	current, found, err := lockRow(ctx, tx, lock)
	if err == nil && !found {
		if _, err = tx.Exec(ctx, createMark, lock); err != nil {
			return gate.Admitted{}, dbError(err)
		}
		current, found, err = lockRow(ctx, tx, lock)
		if err == nil && !found {
			err = gate.StorageFailed(fmt.Sprintf("the mark of %q vanished after it was created", lock), nil)
		}
	}
	if err != nil {
		return gate.Admitted{}, err
	}
	next, err := gate.Decide(current, policy, claims.Epoch, seq)
	if err != nil {
		return gate.Admitted{}, err
	}
	if _, err := tx.Exec(ctx, storeMark, int64(next.Epoch), int64(next.Seq), lock); err != nil {
		return gate.Admitted{}, dbError(err)
	}
	return gate.Admitted{Claims: claims, Previous: current, HighWater: next}, nil
}

func lockRow(ctx context.Context, tx pgx.Tx, lock string) (gate.HighWater, bool, error) {
	var epoch, seq int64
	err := tx.QueryRow(ctx, lockMark, lock).Scan(&epoch, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return gate.HighWater{}, false, nil
	}
	if err != nil {
		return gate.HighWater{}, false, dbError(err)
	}
	mark, err := gate.FromSQL(epoch, seq)
	return mark, err == nil, err
}

// dbError: lost races are write_conflict (retry); anything else is storage_failed.
func dbError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "55P03": // serialization_failure, deadlock_detected, lock_not_available
			return gate.Conflict(err)
		}
	}
	return gate.StorageFailed("PostgreSQL failed: "+err.Error(), err)
}
