package boltkv

import (
	"log/slog"

	bolt "go.etcd.io/bbolt"
)

// ReleaseMapped is DropMapped for the stages that call it after their own
// reads (the window stage, the uplink): a failure is only logged, since the
// pages are only memory and nothing is lost; the error names the file.
func ReleaseMapped(db *bolt.DB, log *slog.Logger) {
	if err := DropMapped(db); err != nil {
		log.Warn("releasing mapped pages failed", "err", err)
	}
}
