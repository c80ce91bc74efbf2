package postgres

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The preflight vectors (vectors/preflight.json, made from the Rust rules in
// crates/adapters/src/preflight.rs): CheckSettings gives the same verdict on every
// PostgreSQL case, each unsafe setting with its value and what it needs, in the same
// order. A rule changed here and not in the other gates fails this test.
func TestCheckSettingsGivesEveryVectorsVerdict(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "vectors", "preflight.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Postgres []struct {
			Fsync          string          `json:"fsync"`
			SyncCommit     string          `json:"synchronous_commit"`
			FullPageWrites string          `json:"full_page_writes"`
			StandbyNames   string          `json:"synchronous_standby_names"`
			Replicas       int64           `json:"replicas"`
			Unsafe         []UnsafeSetting `json:"unsafe"`
		} `json:"postgres"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Postgres) == 0 {
		t.Fatal("no PostgreSQL cases in vectors/preflight.json")
	}
	safe := 0
	for i, c := range file.Postgres {
		err := CheckSettings(c.Fsync, c.SyncCommit, c.FullPageWrites, c.StandbyNames, c.Replicas)
		var found []UnsafeSetting
		var unsafe *UnsafeDatabaseError
		switch {
		case err == nil:
			safe++
		case errors.As(err, &unsafe):
			found = unsafe.Settings
		default:
			t.Fatalf("case %d: %v is not an *UnsafeDatabaseError", i, err)
		}
		if len(found) == 0 && len(c.Unsafe) == 0 {
			continue
		}
		if !reflect.DeepEqual(found, c.Unsafe) {
			t.Errorf("case %d (%+v): got %+v, the vectors say %+v", i, c, found, c.Unsafe)
		}
	}
	if safe == 0 {
		t.Error("no safe case: the file would not notice a rule that refuses everything")
	}
}
