package rig

import "testing"

// compareRows counts missing and unexpected rows as multisets; in
// at-least-once mode extra copies of an expected row are redeliveries,
// not unexpected rows, but a missing copy is still missing.
func TestCompareRows(t *testing.T) {
	want := map[string]int{"a": 2, "b": 1}
	for _, tc := range []struct {
		name        string
		got         map[string]int
		atLeastOnce bool
		result      TableResult
	}{
		{"exact", map[string]int{"a": 2, "b": 1}, false, TableResult{Expected: 3, Rows: 3}},
		{"one short, one extra", map[string]int{"a": 1, "b": 1, "c": 1}, false, TableResult{Expected: 3, Rows: 3, Missing: 1, Unexpected: 1}},
		{"a redelivery, exact", map[string]int{"a": 3, "b": 1}, false, TableResult{Expected: 3, Rows: 4, Unexpected: 1}},
		{"a redelivery, at least once", map[string]int{"a": 3, "b": 1}, true, TableResult{Expected: 3, Rows: 4}},
		{"empty table", nil, true, TableResult{Expected: 3, Missing: 3}},
		{"an unknown row, at least once", map[string]int{"a": 2, "b": 1, "x": 2}, true, TableResult{Expected: 3, Rows: 5, Unexpected: 2}},
	} {
		if got := compareRows(want, tc.got, tc.atLeastOnce); got != tc.result {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.result)
		}
	}
}
