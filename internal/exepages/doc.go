// Package exepages takes the agent's executable out of its resident set.
//
// The kernel maps a binary's pages into the process as they are touched,
// and its fault-around maps the 64 KiB around each; Go runs every
// package's init function at start, one in each package's stretch of
// code, so nearly all of the executable is resident from the first second
// (9.9 of its 11 MB mapped, measured) although the agent's running code
// is a small part of it. Those pages are clean copies of the file, and
// the agent drops them from the process (madvise MADV_DONTNEED) at the
// end of its start and every 250 ms after: what it runs faults back.
// The start also evicts them from the page cache, with the kernel's
// read-around off, so that a fault brings back the page in use alone
// (read once from storage) rather than the 64 KiB of cached pages around
// it; the pages read back stay cached, and a later fault on one is minor.
// That holds for the read-only data. On recent kernels (6.18 measured)
// a fault in executable memory reads ahead whatever madvise said (up to
// the file's read-ahead size, to the mapping's end), so the code is soon
// cached again and only the periodic drops keep it down
// (docs/performance.md, session 32).
package exepages
