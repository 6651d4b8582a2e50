package wire_test

import (
	"bytes"
	"testing"

	"github.com/edgeagent/edgeagent/uplink/wire"
)

func fuzzSeeds(f *testing.F) {
	f.Helper()
	for _, n := range []int{2, 5} {
		b := sampleBatch(f, n)
		for _, enc := range []string{wire.EncodingNone, wire.EncodingZstd} {
			body, err := wire.EncodeBatch(b, enc)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(body)
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0xa0})
	f.Add(append(wire.ZstdMagic[:], 0, 0, 0))
}

// checkCanonical asserts the decoder's output survives an encode/decode round
// trip unchanged: encode(decode(body)) is a fixed point. It compares bytes,
// not values, so NaNs in fuzzed floats do not trip it.
func checkCanonical(t *testing.T, b *wire.Batch) {
	t.Helper()
	for _, enc := range []string{wire.EncodingNone, wire.EncodingZstd} {
		once, err := wire.EncodeBatch(b, enc)
		if err != nil {
			t.Fatalf("re-encode a decoded batch: %v", err)
		}
		back, err := wire.DecodeBatch(once, enc)
		if err != nil {
			t.Fatalf("decode a re-encoded batch: %v", err)
		}
		twice, err := wire.EncodeBatch(back, enc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(once, twice) {
			t.Fatalf("encoding %q is not stable across a round trip", enc)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, enc := range []string{wire.EncodingNone, wire.EncodingZstd} {
			b, err := wire.DecodeBatch(body, enc)
			if err != nil {
				continue
			}
			checkCanonical(t, b)
		}
	})
}

func FuzzDecodeBody(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := wire.DecodeBody(body)
		if err != nil {
			return
		}
		enc := wire.EncodingNone
		if wire.IsZstd(body) {
			enc = wire.EncodingZstd
		}
		direct, err := wire.DecodeBatch(body, enc)
		if err != nil {
			t.Fatalf("DecodeBody accepted what DecodeBatch(%q) refuses: %v", enc, err)
		}
		a1, _ := wire.EncodeBatch(b, wire.EncodingNone)
		a2, _ := wire.EncodeBatch(direct, wire.EncodingNone)
		if !bytes.Equal(a1, a2) {
			t.Fatal("DecodeBody and DecodeBatch decode differently")
		}
		checkCanonical(t, b)
	})
}
