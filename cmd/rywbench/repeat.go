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
		var notes []string
		for _, run := range runs {
			if i >= len(run) || run[i].Name != first.Name || run[i].Status == "n/a" {
				t.Status, t.Ratios = "n/a", nil
				break
			}
			if run[i].Note != "" && !slices.Contains(notes, run[i].Note) {
				notes = append(notes, run[i].Note)
			}
		}
		if t.Status == "n/a" {
			out[i] = t
			continue
		}
		t.Note = strings.Join(notes, "; ")
		stale := false
		for _, run := range runs {
			// judge fails a line on a stale read or an error even where
			// every ratio is within its limit.
			if run[i].Status == "FAIL" && !overLimit(run[i]) {
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
			vals := make([]float64, 0, len(runs))
			for _, run := range runs {
				if j < len(run[i].Ratios) {
					vals = append(vals, run[i].Ratios[j].Value)
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
