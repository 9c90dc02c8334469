package main

import (
	"context"
	"fmt"
	"slices"
)

// headerLimit is the default of the activator's edge.max_header_bytes (docs/config.md). The
// header-limit herd pads each request to headerLimit − 2 KiB, about 30 KiB: as big as the default
// lets a request header be, with room for the request line and the other fields.
const (
	headerLimit = 32 << 10
	heldMemPad  = headerLimit - 2<<10
)

// runHeldMem measures the activator's memory per held request for small requests and for requests
// whose header is at the header limit: herds as runHerd sends them (the tenant held back until every
// request is held or refused), for each -herd size, -herd-runs rounds, the two kinds alternating
// within each round. The config is the default one, process-wide held caps included: requests the caps
// refuse (503) are counted, and the memory is divided by the requests actually held. Only
// edge.max_conns is raised to fit the herd (herdOnce): under the default, past it, requests wait
// unheld until the first are answered, and the measurement would wait for them in vain.
func runHeldMem(ctx context.Context, e *env) error {
	kinds := []struct {
		name string
		pad  int
	}{{"small", 0}, {"header limit", heldMemPad}}
	type key struct{ n, kind int }
	runs := map[key][]HerdRow{}
	// Over HTTP/1.1 (a connection a request), as many as the open-file limit allows.
	var sizes []int
	for _, n := range e.opts.herd {
		if budget := h1Budget(); n > budget {
			e.report.skip(fmt.Sprintf("held memory at %d", n), "the open-file limit allows %d held connections: measured at %d", budget, budget)
			n = budget
		}
		sizes = append(sizes, n)
	}
	sizes = slices.Compact(sizes)
	for i := 0; i < e.opts.herdRuns; i++ {
		for _, n := range sizes {
			for j := range kinds {
				k := (i + j) % len(kinds) // alternate which kind goes first
				h := herdSpec{n: n, run: i + 1, pad: kinds[k].pad}
				row, err := herdOnce(ctx, e, h)
				if err != nil {
					return fmt.Errorf("%d %s requests, run %d: %w", n, kinds[k].name, i+1, err)
				}
				runs[key{n, k}] = append(runs[key{n, k}], row)
				e.log.Info("held memory", "n", n, "kind", kinds[k].name, "run", i+1, "held", row.HeldMax, "refused", row.Refused, "kib_per_held", row.PerHeldKiB)
			}
		}
	}
	for _, n := range sizes {
		per := map[int][]float64{}
		for k, kind := range kinds {
			rows := runs[key{n, k}]
			m := medianHerd(rows)
			for _, r := range rows {
				per[k] = append(per[k], r.PerHeldKiB)
			}
			h := herdSpec{n: n, pad: kind.pad}
			row := HeldMemRow{N: n, Kind: kind.name, RequestBytes: h.requestBytes(), Runs: m.Runs,
				Held: m.HeldMax, Refused: m.Refused, Failed: m.Failed, RSSIdleKiB: m.RSSIdleKiB, RSSHeldKiB: m.RSSHeldKiB,
				PerHeldKiB: summarize(per[k]), FirstFailure: m.FirstFailure}
			if k > 0 {
				row.OverSmall = ratios(per[k], per[0])
			}
			e.report.HeldMem = append(e.report.HeldMem, row)
		}
	}
	return nil
}
