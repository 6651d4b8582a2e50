// Package packaging turns the cross-built edgeagent binaries into Debian
// packages for gateways, and holds what those packages install.
//
// The release artifacts are one static binary per target (see [Arches]):
//
//	dist/edgeagent-linux-armv6   Raspberry Pi Zero/1 class (ARMv6 + VFP)
//	dist/edgeagent-linux-armv7   32-bit ARMv7 (Pi 2, most industrial gateways)
//	dist/edgeagent-linux-arm64   64-bit ARM (Pi 3/4/5 on a 64-bit OS)
//	dist/edgeagent-linux-amd64   x86-64 gateways and test machines
//
// `make cross` builds them; `make deb` runs cmd/mkdeb, which calls
// [BuildDebs]: one `go tool nfpm` run per architecture over nfpm.yaml in this
// directory, with the version from `git describe` turned into a Debian
// version by [DebianVersion].
//
// The files the package installs live next to this one: edgeagent.service
// (the hardened systemd unit), default.env (/etc/default/edgeagent),
// mosquitto-edgeagent.conf (the recommended broker settings, shipped as
// documentation) and scripts/ (the maintainer scripts that create the
// edgeagent system user). The default config is config/example.yaml.
//
// The tests build all of it from the source tree in a temporary directory,
// check that the binaries are static and for the right CPU, run the ARM ones
// under qemu user-mode emulation end to end, and inspect and install the
// .deb into a scratch root with dpkg.
//
// # Caveats
//
// The armel package carries the ARMv6 binary. Debian's own armel port targets
// ARMv5 without an FPU, where it does not run; it is there for ARMv6 boards.
// Raspberry Pi OS calls its 32-bit port armhf although it is built for ARMv6,
// so on a Pi Zero or Pi 1 the armhf package (ARMv7) stops with "Illegal
// instruction": install the armel package with --force-architecture there
// (docs/install.md). The binary is static, so nothing of the armel port is
// pulled in.
package packaging
