package packaging

import "debug/elf"

// Arch is one release target: how it is built, what it is called in dist/
// and in Debian, and how its binary is recognised.
type Arch struct {
	// Name is the artifact suffix (dist/edgeagent-linux-NAME) and what
	// `edgeagent version` prints after "linux/".
	Name   string
	GOARCH string
	// GOARM is the ARM variant ("6", "7"); "" for the other architectures.
	GOARM string
	// Deb is the Debian architecture of the package.
	Deb string
	// Machine is the ELF e_machine the binary must carry.
	Machine elf.Machine
	// Qemu is the user-mode emulator that runs the binary on another CPU.
	Qemu string
}

// BuildTags are the build tags of the release binaries (the Makefile's
// TAGS). nethttpomithttp2 leaves out the HTTP/2 implementation bundled in
// net/http, about 0.5 MiB of the arm64 binary: the status endpoint is plain
// HTTP/1.1 (no TLS, so no h2 to negotiate) and nothing else in the agent
// serves or fetches over HTTP/2.
const BuildTags = "nethttpomithttp2"

// Arches are the release targets, in the order `make cross` builds them.
var Arches = []Arch{
	{Name: "armv6", GOARCH: "arm", GOARM: "6", Deb: "armel", Machine: elf.EM_ARM, Qemu: "qemu-arm-static"},
	{Name: "armv7", GOARCH: "arm", GOARM: "7", Deb: "armhf", Machine: elf.EM_ARM, Qemu: "qemu-arm-static"},
	{Name: "arm64", GOARCH: "arm64", Deb: "arm64", Machine: elf.EM_AARCH64, Qemu: "qemu-aarch64-static"},
	{Name: "amd64", GOARCH: "amd64", Deb: "amd64", Machine: elf.EM_X86_64, Qemu: "qemu-x86_64-static"},
}

// BinaryName is the file name of the arch's binary in dist/.
func (a Arch) BinaryName() string { return "edgeagent-linux-" + a.Name }

// LookupArch finds a target by its Name or its Debian architecture.
func LookupArch(name string) (Arch, bool) {
	for _, a := range Arches {
		if a.Name == name || a.Deb == name {
			return a, true
		}
	}
	return Arch{}, false
}
