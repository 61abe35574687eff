package main

import (
	"slices"
	"strings"
)

// mergeTargets judges the target lines over -repeat's runs: each ratio's
// median, with the runs' least and greatest beside it. A line is n/a when it
// was in any run, fails when a median is over its limit or any run had a
// stale read or an error (its note is kept), and an info line stays one.
func mergeTargets(runs [][]target) []target {
	if len(runs) == 0 {
		return nil
	}
	out := make([]target, len(runs[0]))
	for i, first := range runs[0] {
		t := target{Name: first.Name, Status: first.Status, Note: first.Note}
		// The line in each run, by name (an info line prints only where
		// measured).
		lines := make([]target, 0, len(runs))
		var notes []string
		for _, run := range runs {
			k := slices.IndexFunc(run, func(x target) bool { return x.Name == first.Name })
			if k < 0 || run[k].Status == "n/a" {
				t.Status, t.Ratios = "n/a", nil
				break
			}
			lines = append(lines, run[k])
			if run[k].Note != "" && !slices.Contains(notes, run[k].Note) {
				notes = append(notes, run[k].Note)
			}
		}
		if t.Status == "n/a" {
			out[i] = t
			continue
		}
		t.Note = strings.Join(notes, "; ")
		stale := false
		for _, l := range lines {
			// judge fails a line on a stale read or an error even where
			// every ratio is within its limit.
			if l.Status == "FAIL" && !overLimit(l) {
				stale = true
			}
		}
		if t.Status != "info" {
			t.Status = "PASS"
			if stale {
				t.Status = "FAIL"
			}
		}
		for j, r := range first.Ratios {
			vals := make([]float64, 0, len(lines))
			for _, l := range lines {
				if j < len(l.Ratios) {
					vals = append(vals, l.Ratios[j].Value)
				}
			}
			if len(vals) == 0 {
				continue
			}
			m := targetRatio{Label: r.Label, Limit: r.Limit, Value: median(vals), Min: slices.Min(vals), Max: slices.Max(vals), Runs: len(vals)}
			if t.Status != "info" && m.Value > m.Limit {
				t.Status = "FAIL"
			}
			t.Ratios = append(t.Ratios, m)
		}
		out[i] = t
	}
	return out
}

// overLimit reports whether one of t's ratios is over its limit.
func overLimit(t target) bool {
	for _, r := range t.Ratios {
		if r.Value > r.Limit {
			return true
		}
	}
	return false
}

// median of vals (not empty): the middle one, or the mean of the middle two.
func median(vals []float64) float64 {
	v := slices.Clone(vals)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
