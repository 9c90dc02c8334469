package registry_test

import (
	"bytes"
	"runtime"
	"runtime/metrics"
	"strconv"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// TestLoadReleasesTrees checks that a load does not hold every entry's YAML tree until its end: once
// the last entry is being decoded, the heap must have grown by about what the Routes decoded so far
// take, not by the file's trees as well (over 4 KB an entry of scaleConfig's, three times the rest).
// The heap is measured from inside the last entry's decoder, after a forced collection, so the figure
// depends on what is reachable there, not on when collections happen to run. Entries that other
// workers are still decoding hold their trees: up to a run (parseRunMax, 512 entries) or a chunk
// (256) each, which the bound allows for. Before, every entry's tree was held: 5.7 KB an entry.
func TestLoadReleasesTrees(t *testing.T) {
	const (
		n        = 20000
		perEntry = 2500 // bytes an entry may hold once decoded: its Route, settings, entry and checks
		perTree  = 6000 // bytes of a tree of scaleConfig's, parsed
		inFlight = 512  // entries a worker may be decoding: a run of a Reloader's, or Load's chunk
	)
	data := scaleConfig(n)
	every := bytes.ReplaceAll(data, []byte("wake_budget: 60s"), []byte("wake_budget: 61s"))
	last := "r" + strconv.Itoa(n-1)
	var armed bool
	var grown int64 // the heap's growth when the last entry was decoded, since the load began
	var before uint64
	probe := func(r *registry.Route, node *yaml.Node) (any, error) {
		if armed && r.Name == last {
			grown = int64(liveHeap()) - int64(before)
		}
		return decodeChecked(r, node)
	}
	decoders := map[string]registry.SettingsDecoder{"exec": probe}
	for _, tc := range []struct {
		name string
		// load loads data, calling arm just before the load that is measured.
		load func(arm func()) error
	}{
		{"Load", func(arm func()) error {
			arm()
			_, err := registry.Load(data, decoders)
			return err
		}},
		{"Reloader/first", func(arm func()) error {
			arm()
			_, err := registry.NewReloader(decoders).Load(data)
			return err
		}},
		{"Reloader/every", func(arm func()) error {
			rl := registry.NewReloader(decoders)
			old, err := rl.Load(data)
			if err != nil {
				return err
			}
			arm()
			_, err = rl.Load(every)
			runtime.KeepAlive(old) // the server holds the old config until the new one replaces it
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			armed, grown = false, -1
			arm := func() { armed, before = true, liveHeap() }
			if err := tc.load(arm); err != nil {
				t.Fatal(err)
			}
			if grown < 0 {
				t.Fatalf("the decoder of %s was not called", last)
			}
			bound := int64(n*perEntry + runtime.GOMAXPROCS(0)*inFlight*perTree)
			t.Logf("the heap grew by %d bytes (%d an entry) by the last entry's decode; bound %d", grown, grown/n, bound)
			if grown > bound {
				t.Errorf("the heap grew by %d bytes, %d an entry, by the decode of the last of %d entries; want at most %d: are the entries' trees held until the load ends?", grown, grown/n, n, bound)
			}
		})
	}
}

// liveHeap collects garbage and returns the bytes of the heap's objects that the collection found
// reachable.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
