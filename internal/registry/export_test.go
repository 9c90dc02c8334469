package registry

// MaxAnchorEntries is maxAnchorEntries, for the external tests.
const MaxAnchorEntries = maxAnchorEntries
