package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// helperEnv makes the test binary play the rig under make: take the
// terminal, say so, and exit 0 on the Ctrl-C.
const helperEnv = "EDGERIG_FOREGROUND_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "" {
		os.Exit(m.Run())
	}
	restore := takeTerminal()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	fmt.Println("helper ready")
	<-sig
	fmt.Println("helper stopped")
	restore()
	os.Exit(0)
}

// TestCtrlCUnderMake runs the helper as a make recipe on a real pseudo
// terminal and types a Ctrl-C: make must exit with the helper's status,
// 0, not by the signal ("Interrupt").
func TestCtrlCUnderMake(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make is not installed")
	}
	master, slave, err := openPTY()
	if err != nil {
		t.Skipf("no pseudo terminal here: %v", err)
	}
	defer master.Close()
	dir := t.TempDir()
	makefile := fmt.Sprintf("all:\n\t%s=1 %s\n", helperEnv, os.Args[0])
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(makefile), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, mk, "-s", "-C", dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A session of its own with the terminal as its controlling one, as
	// a login shell has: make is then in the terminal's foreground.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	out := make(chan string, 1)
	ready := make(chan struct{})
	go func(ready chan struct{}) { // owned by the test: ends when the terminal closes (make and the helper exited)
		var b bytes.Buffer
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			b.Write(buf[:n])
			if ready != nil && strings.Contains(b.String(), "helper ready") {
				close(ready)
				ready = nil
			}
			if err != nil {
				out <- b.String()
				return
			}
		}
	}(ready)
	select {
	case <-ready:
	case <-ctx.Done():
		t.Fatal("the helper never became ready")
	}
	if _, err := master.Write([]byte{3}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	werr := cmd.Wait()
	text := <-out
	if werr != nil || !strings.Contains(text, "helper stopped") {
		t.Fatalf("make: %v, want exit 0 with the helper stopped by the Ctrl-C; terminal:\n%s", werr, text)
	}
}

// openPTY opens a pseudo terminal pair.
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		master.Close()
		return nil, nil, fmt.Errorf("pty number: %w", e)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}
