package ingest

import (
	"bytes"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// queued returns how many bytes wait in c's receive queue, and whether a
// poll finds c readable now.
func queued(t *testing.T, c *net.TCPConn) (n int, readable bool) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		var q int32
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&q))); errno != 0 {
			serr = errno
			return
		}
		n = int(q)
		var set syscall.FdSet
		bits := uintptr(unsafe.Sizeof(set.Bits[0])) * 8 // 64, or 32 on 32-bit ARM
		set.Bits[fd/bits] |= 1 << (fd % bits)
		ready, err := syscall.Select(int(fd)+1, &set, nil, nil, &syscall.Timeval{})
		serr, readable = err, ready > 0
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return n, readable
}

// waitQueued waits, with a deadline, until c's receive queue holds n bytes.
func waitQueued(t *testing.T, c *net.TCPConn, n int) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		got, readable := queued(t, c)
		if got >= n {
			return readable
		}
	}
	t.Fatalf("the receive queue never reached %d bytes", n)
	return false
}

// A read waits no longer than the conn's wait for bytes under the mark,
// and the mark reaches the kernel: with 4 KiB set, 100 queued bytes do not
// make the socket readable and 4,100 do.
func TestLowatMarkWakesTheReaderAtItsBytes(t *testing.T) {
	client, server := tcpPair(t)
	c := batchedReads(client).(*lowatConn)
	c.want = 4 << 10
	c.setTo(c.want)
	if c.broken || c.mark != 4<<10 {
		t.Fatalf("the kernel refused SO_RCVLOWAT %d", 4<<10)
	}
	// The read below starts on an empty queue and the 100 bytes come after
	// it began (its deadline's clock reading says when): they stay under
	// the mark, and only the wait can end the read.
	began := make(chan struct{})
	var once sync.Once
	c.now = func() time.Time {
		once.Do(func() { close(began) })
		return time.Now()
	}
	c.wait = 50 * time.Millisecond
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	buf := make([]byte, 64<<10)
	go func() {
		n, err := c.Read(buf)
		done <- result{buf[:n], err}
	}()
	<-began
	msg := bytes.Repeat([]byte("m"), 100)
	if _, err := server.Write(msg); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || !bytes.Equal(r.b, msg) {
			t.Fatalf("read under the mark: %d bytes, %v; want the 100 written", len(r.b), r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read under the mark did not return after its wait")
	}
	if c.mark != 4<<10 {
		t.Fatalf("the mark is %d after a read under it, want it back at %d", c.mark, 4<<10)
	}

	// With nothing being read, the kernel holds 100 bytes back from a
	// poll and wakes it at the mark.
	if _, err := server.Write(msg); err != nil {
		t.Fatal(err)
	}
	if waitQueued(t, client, len(msg)) {
		t.Fatal("100 bytes under a 4 KiB mark made the socket readable")
	}
	burst := bytes.Repeat([]byte("b"), 4000)
	if _, err := server.Write(burst); err != nil {
		t.Fatal(err)
	}
	if !waitQueued(t, client, len(msg)+len(burst)) {
		t.Fatal("4,100 bytes over a 4 KiB mark left the socket unreadable")
	}
	n, err := c.Read(buf)
	if want := append(msg, burst...); err != nil || !bytes.Equal(buf[:n], want) {
		t.Fatalf("read over the mark: %d bytes, %v; want the 4,100 written", n, err)
	}
}
