package status

import (
	"io/fs"
	"syscall"
)

// inodeAndCtime are the file's inode and change time (which chown and
// chmod move, unlike the modification time).
func inodeAndCtime(fi fs.FileInfo) (int64, int64) {
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(sys.Ino), sys.Ctim.Nano()
	}
	return 0, 0
}
