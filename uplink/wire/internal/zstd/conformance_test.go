package zstd_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	upstream "github.com/klauspost/compress/zstd"

	fork "github.com/edgeagent/edgeagent/uplink/wire/internal/zstd"
)

// The options the agent encodes with (uplink/wire).
func forkEncoder(t *testing.T) *fork.Encoder {
	t.Helper()
	enc, err := fork.NewWriter(nil, fork.WithEncoderConcurrency(1),
		fork.WithEncoderLevel(fork.SpeedBetterCompression), fork.WithWindowSize(256<<10),
		fork.WithLowerEncoderMem(true))
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

func upstreamEncoder(t *testing.T) *upstream.Encoder {
	t.Helper()
	enc, err := upstream.NewWriter(nil, upstream.WithEncoderConcurrency(1),
		upstream.WithEncoderLevel(upstream.SpeedBetterCompression), upstream.WithWindowSize(256<<10),
		upstream.WithLowerEncoderMem(true))
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// rowsLike makes n bytes of rows that repeat with small changes, like a
// batch of aggregates, with a random tail so literals and matches mix.
func rowsLike(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "gw-1/temp/%d/dev-%04d/1 min=%.2f max=%.2f ", int64(1700000000000)+int64(i/50)*60000, i%50, 20+r.Float64(), 25+r.Float64())
		if r.IntN(7) == 0 {
			for range r.IntN(40) {
				b.WriteByte(byte(r.Uint32()))
			}
		}
	}
	return b.Bytes()[:n]
}

// TestForkFramesAreStandard: frames the fork writes decode with upstream's
// decoder (and the fork decodes upstream's), at every size from empty past
// the window and past one block, so receivers are untouched by the fork.
func TestForkFramesAreStandard(t *testing.T) {
	fe, ue := forkEncoder(t), upstreamEncoder(t)
	fd, err := fork.NewReader(nil, fork.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	ud, err := upstream.NewReader(nil, upstream.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer ud.Close()
	for i, n := range []int{0, 1, 100, 4 << 10, 100 << 10, 128<<10 + 17, 300 << 10, 1 << 20} {
		src := rowsLike(n, uint64(i))
		frame := fe.EncodeAll(src, nil)
		got, err := ud.DecodeAll(frame, nil)
		if err != nil {
			t.Fatalf("%d bytes: upstream cannot decode the fork's frame: %v", n, err)
		}
		if !bytes.Equal(got, src) {
			t.Fatalf("%d bytes: upstream decoded the fork's frame to other bytes", n)
		}
		got, err = fd.DecodeAll(ue.EncodeAll(src, nil), nil)
		if err != nil || !bytes.Equal(got, src) {
			t.Fatalf("%d bytes: the fork does not read upstream's frame back (%v)", n, err)
		}
	}
}

// TestForkEncoderHoldsLessHeap checks what the fork is for: an encoder that
// has compressed a batch holds at least 2 MiB less heap than upstream's
// (3.4 MiB less when measured: 1.15 against 4.52; the margin is for noise).
func TestForkEncoderHoldsLessHeap(t *testing.T) {
	src := rowsLike(100<<10, 7)
	held := func(newAndEncode func() any) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		enc := newAndEncode()
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(enc)
		return after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc)
	}
	forkHeld := held(func() any { e := forkEncoder(t); e.EncodeAll(src, nil); return e })
	upstreamHeld := held(func() any { e := upstreamEncoder(t); e.EncodeAll(src, nil); return e })
	t.Logf("encoder heap after a 100 KiB batch: fork %.2f MiB, upstream %.2f MiB", float64(forkHeld)/(1<<20), float64(upstreamHeld)/(1<<20))
	if forkHeld+2<<20 > upstreamHeld {
		t.Fatalf("fork's encoder holds %d bytes, upstream's %d: want at least 2 MiB less", forkHeld, upstreamHeld)
	}
}
