package alert

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestLocalMessageLiteralHTML: a local alert message carries its condition
// as written ("mean > 80", not "mean \u003e 80"), and is otherwise byte for
// byte what json.Marshal gives, with no trailing newline.
func TestLocalMessageLiteralHTML(t *testing.T) {
	db := openDB(t, "")
	r := overheating()
	r.For = 1
	e := newEngine(t, db, testConfig(r))
	emit(t, db, e, win("press-1", "temperature", 0, 85, 1))
	ls := locals(t, db)
	if len(ls) != 1 {
		t.Fatalf("%d local rows, want 1", len(ls))
	}
	p := ls[0].Msg.Payload
	if !bytes.Contains(p, []byte(`"condition":"mean > 80"`)) {
		t.Fatalf("local message %s: condition not literal", p)
	}

	// Against json.Marshal, for every message type.
	html := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&")
	for _, v := range []any{
		AlertMessage{Type: TypeAlert, Rule: "r<1>&", Condition: "max >= 1e3", Value: finite(2.5)},
		&SummaryMessage{Type: TypeSummary, Rule: "r", Devices: []string{"a&b", "<c>"}},
		AggregateMessage{Type: TypeAggregate, Device: "d>1", Sum: finite(1), Key: "k&"},
	} {
		got, err := marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		std, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if want := html.Replace(string(std)); string(got) != want {
			t.Fatalf("marshal\n got %s\nwant %s", got, want)
		}
	}
}
