package postgres

// Preflight: whether the database can keep the gate's promise (S6). The mark is as
// durable as PostgreSQL's commit; a database that acknowledges a commit before it is on
// disk can lose a mark in a crash and admit again a holder it had fenced out. The rule is
// the Rust gate's (crates/adapters/src/preflight.rs) and the Python gate's.

import (
	"context"
	"fmt"
	"strings"

	palisade "github.com/palisade/palisade-go"
)

// settingsQuery reads what CheckSettings takes, in its argument order.
const settingsQuery = "SELECT current_setting('fsync'), current_setting('synchronous_commit'), " +
	"current_setting('full_page_writes'), current_setting('synchronous_standby_names'), " +
	"(SELECT count(*) FROM pg_stat_replication)"

// UnsafeSetting is a database setting that breaks the gate's durability: its Name, its
// Value now, and what it Needs to be.
type UnsafeSetting struct {
	Name, Value, Needs string
}

// UnsafeDatabaseError is storage_failed: the database's settings cannot keep a mark
// durable, and nothing was done. Settings names every one that breaks it.
type UnsafeDatabaseError struct {
	palisade.APIError
	Settings []UnsafeSetting
}

// Unwrap gives the API error, so errors.As(err, &apiErr) reads its code.
func (e *UnsafeDatabaseError) Unwrap() error { return &e.APIError }

// CheckSettings is the rule: fsync and full_page_writes on; synchronous_commit not off,
// and not local while synchronous standbys are configured; streaming replicas only with
// synchronous_standby_names (a failover to an asynchronous standby can lose marks). It
// returns an *UnsafeDatabaseError naming every unsafe setting, or nil.
func CheckSettings(fsync, synchronousCommit, fullPageWrites, standbyNames string, replicas int64) error {
	var bad []UnsafeSetting
	if fsync != "on" {
		bad = append(bad, UnsafeSetting{"fsync", fsync, "on"})
	}
	if fullPageWrites != "on" {
		bad = append(bad, UnsafeSetting{"full_page_writes", fullPageWrites, "on"})
	}
	standbys := strings.TrimSpace(standbyNames) != ""
	switch synchronousCommit {
	case "on", "remote_apply", "remote_write":
	case "local":
		if standbys {
			bad = append(bad, UnsafeSetting{"synchronous_commit", synchronousCommit,
				"on, remote_write or remote_apply while synchronous standbys are configured"})
		}
	default:
		bad = append(bad, UnsafeSetting{"synchronous_commit", synchronousCommit, "on (or local without standbys)"})
	}
	if replicas > 0 && !standbys {
		bad = append(bad, UnsafeSetting{"synchronous_standby_names", standbyNames,
			"the streaming replicas named (they are asynchronous: a failover to one can lose marks)"})
	}
	if len(bad) == 0 {
		return nil
	}
	parts := make([]string, len(bad))
	for i, s := range bad {
		parts[i] = fmt.Sprintf("%s is %q, needs %s", s.Name, s.Value, s.Needs)
	}
	message := "PostgreSQL cannot keep fenced writes durable: " + strings.Join(parts, "; ") +
		" (docs/protecting-your-database.md, \"Preflight\"; MigrateUnchecked skips this check, for tests only)"
	return &UnsafeDatabaseError{palisade.APIError{Status: 503, Code: "storage_failed", Message: message}, bad}
}

// Preflight checks that the database db reaches can keep a mark durable (CheckSettings):
// an *UnsafeDatabaseError names every setting that breaks it. Run it when the
// application starts; Migrate runs it too.
func Preflight(ctx context.Context, db Querier) error {
	var fsync, synchronousCommit, fullPageWrites, standbyNames string
	var replicas int64
	err := db.QueryRow(ctx, settingsQuery).Scan(&fsync, &synchronousCommit, &fullPageWrites, &standbyNames, &replicas)
	if err != nil {
		return dbError(err)
	}
	return CheckSettings(fsync, synchronousCommit, fullPageWrites, standbyNames, replicas)
}
