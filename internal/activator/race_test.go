//go:build race

package activator

// raceEnabled: the race detector is on. It makes stacks and allocations larger, so memory bounds
// allow more (TestHeldMemoryCeiling).
const raceEnabled = true
