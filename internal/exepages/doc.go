// Package exepages takes the agent's executable out of its resident set.
//
// The kernel maps a binary's pages into the process as they are touched,
// and its fault-around maps the 64 KiB around each; Go runs every
// package's init function at start, one in each package's stretch of
// code, so nearly all of the executable is resident from the first second
// (9.9 of its 11 MB mapped, measured) although the agent's running code
// is a small part of it. Those pages are clean copies of the file:
// dropping them from the process (madvise MADV_DONTNEED) leaves them in
// the page cache, and the next use of one is a minor fault while the
// kernel keeps them there. Unmapped, they are also the first it reclaims
// under memory pressure (they stay charged to the service's cgroup until
// then): a gateway short of memory reads them back from its storage.
package exepages
