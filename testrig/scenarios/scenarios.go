// Package scenarios embeds the rig's stock scenario files, so edgerig can
// run them by name from any directory.
package scenarios

import "embed"

// Files holds every *.yaml scenario in this directory.
//
//go:embed *.yaml
var Files embed.FS
