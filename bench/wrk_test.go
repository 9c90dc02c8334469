package main

import (
	"math"
	"testing"
)

func TestParseH2load(t *testing.T) {
	out := `starting benchmark...
spawning thread #0: 16 total client(s). Timing-based test with 0s of warm-up time and 3s of main duration for measurements.
Application protocol: h2c

finished in 3.00s, 7608.67 req/s, 306.57KB/s
requests: 22826 total, 22986 started, 22826 done, 22820 succeeded, 4 failed, 1 errored, 1 timeout
status codes: 22888 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 919.72KB (941789) total, 93.45KB (95693) headers (space savings 95.67%), 423.53KB (433694) data
                     min         max         mean         sd        +/- sd
time for request:      809us    109.54ms     20.77ms     10.29ms    81.20%
`
	r, err := parseH2load(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.RPS != 7608.67 || r.Requests != 22826 || r.Errors != 6 || r.Timeouts != 1 || !math.IsNaN(r.P50) || !math.IsNaN(r.P99) {
		t.Errorf("parseH2load = %+v", r)
	}
	// An h2load that could not speak h2c to the server finishes with nothing done.
	if _, err := parseH2load("finished in 1.00s, 0.00 req/s, 0B/s\nrequests: 0 total, 16 started, 0 done, 0 succeeded, 16 failed, 16 errored, 0 timeout\n"); err == nil {
		t.Error("parseH2load accepted a run with nothing done")
	}
}
