// Command fenced-writer is the Go gate driven from the command line, for the
// cross-language test (clients/python/tests/test_five_languages.py): the same arguments
// and the same outcome lines as the Rust adapters' fenced_writer example, so one test can
// put writers of every language on one PostgreSQL table.
//
//	fenced-writer write --db postgres:<conninfo> --table <name> --public-key <hex>[,<hex>...]
//	                    --lock <lock> --key <key> --value <value> --token <token> [--seq <n>]
//
// One transaction admits the token (retried on write_conflict, as the docs tell users) and
// upserts key = value. The outcome is one line on stdout: `admitted <epoch> <high_water>`
// or `refused <code> <detail>`. Exit 0 when the line was printed, 2 on a usage or
// database error.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	palisade "github.com/palisade/palisade-go"
	"github.com/palisade/palisade-go/gate"
	"github.com/palisade/palisade-go/gate/postgres"
	"github.com/palisade/palisade-go/token"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fenced-writer:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	if len(args) == 0 || args[0] != "write" {
		return errors.New("usage: fenced-writer write --db postgres:<conninfo> --table <name> --public-key <hex> --lock <lock> --key <key> --value <value> --token <token> [--seq <n>]")
	}
	flags := map[string]string{}
	for rest := args[1:]; len(rest) > 0; rest = rest[2:] {
		name, ok := strings.CutPrefix(rest[0], "--")
		if !ok || len(rest) < 2 {
			return fmt.Errorf("unexpected argument %q", rest[0])
		}
		flags[name] = rest[1]
	}
	for _, name := range []string{"db", "table", "public-key", "lock", "key", "value", "token"} {
		if _, ok := flags[name]; !ok {
			return fmt.Errorf("missing --%s", name)
		}
	}
	ring := token.NewKeyRing()
	for _, key := range strings.Split(flags["public-key"], ",") {
		raw, err := hex.DecodeString(key)
		if err != nil {
			return fmt.Errorf("--public-key: %w", err)
		}
		if _, err := ring.Add(raw); err != nil {
			return err
		}
	}
	verifier := token.NewVerifier(ring, 16)
	conninfo, ok := strings.CutPrefix(flags["db"], "postgres:")
	if !ok {
		return errors.New("--db must be postgres:<conninfo>")
	}
	var seq uint64
	if text, ok := flags["seq"]; ok {
		var err error
		if seq, err = strconv.ParseUint(text, 10, 64); err != nil {
			return fmt.Errorf("--seq: %w", err)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, conninfo)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	upsert := "INSERT INTO " + pgx.Identifier{flags["table"]}.Sanitize() +
		" (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
	for {
		admitted, err := write(ctx, conn, verifier, flags, seq, upsert)
		var conflict *gate.ConflictError
		if errors.As(err, &conflict) {
			continue // rolled back: retry the whole transaction
		}
		return report(admitted, err)
	}
}

func write(ctx context.Context, conn *pgx.Conn, verifier *token.Verifier, flags map[string]string, seq uint64, upsert string) (gate.Admitted, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return gate.Admitted{}, err
	}
	defer tx.Rollback(ctx)
	var admitted gate.Admitted
	if _, sequenced := flags["seq"]; sequenced {
		admitted, err = postgres.AdmitSequenced(ctx, tx, verifier, flags["token"], flags["lock"], seq)
	} else {
		admitted, err = postgres.Admit(ctx, tx, verifier, flags["token"], flags["lock"])
	}
	if err != nil {
		return gate.Admitted{}, err
	}
	if _, err := tx.Exec(ctx, upsert, flags["key"], flags["value"]); err != nil {
		return gate.Admitted{}, err
	}
	return admitted, tx.Commit(ctx)
}

// report prints the outcome line; a failure that is not a refusal is an error of the run.
func report(admitted gate.Admitted, err error) error {
	if err == nil {
		fmt.Printf("admitted %d %d\n", admitted.Claims.Epoch, admitted.HighWater.Epoch)
		return nil
	}
	var api *palisade.APIError
	if !errors.As(err, &api) || api.Code == "storage_failed" {
		return err
	}
	detail := "-"
	var stale *palisade.StaleTokenError
	var staleSeq *palisade.StaleSequenceError
	var wrong *palisade.WrongLockError
	switch {
	case errors.As(err, &stale):
		detail = fmt.Sprintf("%d:%d", stale.HighWater, stale.Epoch)
	case errors.As(err, &staleSeq):
		detail = fmt.Sprintf("%d:%d:%d:%d", staleSeq.HighWater, staleSeq.HighWaterSeq, staleSeq.Epoch, staleSeq.Seq)
	case errors.As(err, &wrong):
		detail = wrong.TokenLock
	case errors.Is(err, token.ErrMalformed):
		detail = "malformed"
	case errors.Is(err, token.ErrUnknownKey):
		detail = "unknown_key"
	case errors.Is(err, token.ErrBadSignature):
		detail = "bad_signature"
	}
	fmt.Printf("refused %s %s\n", api.Code, detail)
	return nil
}
