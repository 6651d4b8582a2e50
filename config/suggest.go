package config

import "strings"

// suggest returns the candidate nearest to s when it is close enough to be
// a likely typo ("bronze_retension" → "bronze_retention"), else "".
// Comparison ignores case and treats '-' as '_', the two slips technicians
// make most.
func suggest(s string, candidates []string) string {
	norm := func(x string) string { return strings.ReplaceAll(strings.ToLower(x), "-", "_") }
	ns := norm(s)
	if len(ns) > 64 {
		return "" // no key is that long; skip the quadratic comparison
	}
	// Allow roughly one edit per three characters, at most three, so short
	// keys only match near-identical ones.
	limit := min(max(len(ns)/3, 1), 3)
	best, bestD := "", limit+1
	for _, c := range candidates {
		if d := editDistance(ns, norm(c)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the optimal-string-alignment distance: insertions,
// deletions, substitutions and swaps of adjacent characters each cost one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// Three rows suffice: the swap case looks two rows back.
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
