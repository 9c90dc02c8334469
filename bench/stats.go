package main

import (
	"math"
	"slices"
)

// Stat summarises repeated measurements of one quantity: the median and the spread (min, max).
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// summarize returns the Stat of vs; NaNs (failed runs) are left out.
func summarize(vs []float64) Stat {
	var ok []float64
	for _, v := range vs {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			ok = append(ok, v)
		}
	}
	if len(ok) == 0 {
		return Stat{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(ok)
	s := Stat{Min: ok[0], Max: ok[len(ok)-1], N: len(ok)}
	if n := len(ok); n%2 == 1 {
		s.Median = ok[n/2]
	} else {
		s.Median = (ok[n/2-1] + ok[n/2]) / 2
	}
	return s
}

// valid reports whether the Stat has at least one measurement.
func (s Stat) valid() bool { return s.N > 0 }

// ratios divides a[i] by b[i] run by run (the runs alternate, so run i of each was measured side by
// side) and summarises the per-run ratios.
func ratios(a, b []float64) Stat {
	n := min(len(a), len(b))
	out := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		if b[i] == 0 {
			out = append(out, math.NaN())
			continue
		}
		out = append(out, a[i]/b[i])
	}
	return summarize(out)
}

// percentile returns the p-th percentile (0..100) of vs by nearest rank; vs need not be sorted.
func percentile(vs []float64, p float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	i = max(0, min(i, len(s)-1))
	return s[i]
}
