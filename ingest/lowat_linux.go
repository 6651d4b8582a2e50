package ingest

import (
	"net"
	"syscall"
)

// batchedReads returns c with its reads batched by the socket's receive
// low-water mark (see lowatConn), or c itself if it is not a TCP
// connection.
func batchedReads(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return newLowat(tc, func(n int) error {
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
		}); err != nil {
			return err
		}
		return serr
	})
}
