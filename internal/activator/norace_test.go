//go:build !race

package activator

// raceEnabled: the race detector is on (see race_test.go).
const raceEnabled = false
