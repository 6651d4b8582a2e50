//go:build !linux

package exepages

// Pages does nothing where madvise is not used.
type Pages struct{}

// Find returns Pages that drop nothing.
func Find() *Pages { return &Pages{} }

// Drop does nothing.
func (p *Pages) Drop(start bool) error { return nil }
