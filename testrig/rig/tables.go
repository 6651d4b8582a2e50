package rig

import (
	"fmt"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"
	"github.com/edgeagent/edgeagent/testrig/truth"
)

// Tables compares the agent's late and dead-letter tables with the rows
// the truth expects: the counters say how many, the tables which.
type Tables struct {
	Late        TableResult `json:"late"`
	DeadLetters TableResult `json:"dead_letters"`
}

// TableResult counts a table's rows against the truth's. Missing are
// expected rows the table lacks; Unexpected rows it holds beyond the
// truth's (in at-least-once mode only rows of keys the truth has not: a
// redelivered message is stored, and judged, again).
type TableResult struct {
	Expected   int `json:"expected"`
	Rows       int `json:"rows"`
	Missing    int `json:"missing"`
	Unexpected int `json:"unexpected"`
}

// maxTableRows bounds what is read of each table; the agent keeps at most
// 100,000 rows of each.
const maxTableRows = 200_000

// checkTables reads the stopped agent's tables from its state database.
func checkTables(dataDir string, exp *truth.Expected, atLeastOnce bool) (*Tables, error) {
	db, err := boltkv.Open(filepath.Join(dataDir, "state.db"), 0, true, 0)
	if err != nil {
		return nil, fmt.Errorf("read the agent's tables: %w", err)
	}
	defer db.Close()
	var late map[truth.LateRow]int
	var dead map[truth.DeadRow]int
	err = db.View(func(tx *bolt.Tx) error {
		late, dead, err = truth.ReadTables(tx, maxTableRows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the agent's tables: %w", err)
	}
	return &Tables{Late: compareRows(exp.LateRows, late, atLeastOnce), DeadLetters: compareRows(exp.DeadRows, dead, atLeastOnce)}, nil
}

func compareRows[K comparable](want, got map[K]int, atLeastOnce bool) TableResult {
	var r TableResult
	for k, n := range want {
		r.Expected += n
		r.Missing += max(0, n-got[k])
	}
	for k, m := range got {
		r.Rows += m
		if n := want[k]; n == 0 || !atLeastOnce {
			r.Unexpected += max(0, m-n)
		}
	}
	return r
}
