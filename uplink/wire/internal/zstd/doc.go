// Package zstd is github.com/klauspost/compress/zstd, at the version go.mod
// requires, with a smaller long-match table for SpeedBetterCompression:
// 512 KiB instead of 4 MiB, for about 0.1 % more bytes on the wire. The
// upstream package has no option for it, and the table was the gateway's
// largest allocation under load. Its encoder is built only at that level,
// without a dictionary, as the agent uses it: the other levels' encoders
// were 39 KB of the arm64 binary's code. fork_test.go derives the fork from the
// module cache and fails on any other difference; its -update flag rewrites
// the fork after a bump of klauspost/compress in go.mod.
package zstd
