package truth

import (
	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/window"
)

// ReadTables reads up to max rows of each of an agent's late and
// dead-letter tables, as the rows LateRows and DeadRows expect.
func ReadTables(tx *bolt.Tx, max int) (map[LateRow]int, map[DeadRow]int, error) {
	late, dead := map[LateRow]int{}, map[DeadRow]int{}
	ls, err := window.ReadLate(tx, window.Filter{}, max)
	if err != nil {
		return nil, nil, err
	}
	for _, l := range ls {
		late[LateRow{Device: l.Device, Metric: l.Metric, EventTime: l.EventTime, WindowStart: l.WindowStart, Value: l.Value}]++
	}
	ds, err := window.ReadDeadLetters(tx, window.Filter{}, max)
	if err != nil {
		return nil, nil, err
	}
	for _, d := range ds {
		dead[DeadRow{Topic: d.Topic, Payload: string(d.Payload), Code: d.Code}]++
	}
	return late, dead, nil
}
