//go:build !linux

package exepages

// Pages does nothing where madvise is not used.
type Pages struct{}

// Drop does nothing.
func (p *Pages) Drop() error { return nil }
