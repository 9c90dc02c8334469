package demoapp

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"testing"
)

// TestBound: GET /bound answers what encoding/json writes for the map of pid, main_ns and bound_ns,
// which the benchmarks and tests decode.
func TestBound(t *testing.T) {
	tests := []struct {
		name            string
		mainNS, boundNS int64
	}{
		{"zero", 0, 0},
		{"wall clock", 1796134585325503771, 1796134585334147527},
		{"negative", -1, -2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			Handler(tt.mainNS, tt.boundNS).ServeHTTP(rec, httptest.NewRequest("GET", "/bound", nil))
			want, err := json.Marshal(map[string]int64{"pid": int64(os.Getpid()), "main_ns": tt.mainNS, "bound_ns": tt.boundNS})
			if err != nil {
				t.Fatal(err)
			}
			if got := rec.Body.String(); got != string(want)+"\n" {
				t.Errorf("GET /bound = %q, want %q", got, string(want)+"\n")
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
		})
	}
}
