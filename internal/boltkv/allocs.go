package boltkv

import (
	"reflect"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// maxAllocs is how many entries ForgetAllocations lets bbolt's map of
// allocations grow to before it starts the map again (a variable only so
// tests can lower it).
var maxAllocs = 4096

// ForgetAllocations empties bbolt's record of which transaction allocated
// each page it took from the freelist, once it holds maxAllocs entries.
// It must run inside a writable transaction of tx's database (the only
// code that reads or writes the record), and reports whether it found it.
//
// bbolt (1.5) keeps that record (freelist's allocs) until the page is freed
// again, and only uses it to reuse, while a read transaction is open, a
// page that was allocated and freed after that read began; a page it does
// not find waits until the older readers end, as any other. An append-only
// log frees its pages only when it trims them, so from its first reuse of
// a freed page the record grows with the log: 150,000 entries, 4.5 MB of
// heap, for 600 MB of chunks held at a byte bound (measured), and in load
// mode Bronze's record was 2.5 MB of the heap at 4 minutes and 4.1 MB at 8.
// Go's maps never shrink, so the record is replaced, not cleared.
func ForgetAllocations(tx *bolt.Tx) bool {
	m, ok := allocations(tx.DB())
	if ok && m.Len() >= maxAllocs {
		m.Set(reflect.MakeMap(m.Type()))
	}
	return ok
}

// allocations returns the record as a settable map, reached through
// bbolt's unexported fields (DB.freelist, an *array or *hashMap, whose
// embedded *shared holds allocs); false if the layout is not that.
func allocations(db *bolt.DB) (reflect.Value, bool) {
	fl := reflect.ValueOf(db).Elem().FieldByName("freelist")
	if fl.Kind() != reflect.Interface || fl.IsNil() {
		return reflect.Value{}, false
	}
	impl := fl.Elem()
	if impl.Kind() != reflect.Pointer || impl.IsNil() || impl.Elem().Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	shared := impl.Elem().FieldByName("shared")
	if shared.Kind() != reflect.Pointer || shared.IsNil() || shared.Elem().Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	m := shared.Elem().FieldByName("allocs")
	if m.Kind() != reflect.Map {
		return reflect.Value{}, false
	}
	return reflect.NewAt(m.Type(), unsafe.Pointer(m.UnsafeAddr())).Elem(), true
}
