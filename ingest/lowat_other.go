//go:build !linux

package ingest

import "net"

// batchedReads returns c: the receive low-water mark's wake-ups are
// Linux's (see lowatConn).
func batchedReads(c net.Conn) net.Conn { return c }
