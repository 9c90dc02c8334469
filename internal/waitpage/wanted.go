// Package waitpage owns the page a person sees while a sleeping tenant wakes (issue 14 §1): who gets
// it, the page itself (built in, or a route's own html/template), the Server-Sent Events that let it
// follow the wake live, and the estimate of how long a route's wake takes. It knows nothing about
// instances, backings or the config file; the edge (internal/activator) decides when to answer with
// it, and cmd/activator runs the template check (New) for `check`, start-up and reload, since the
// registry, which knows config and not HTML, does not import this package.
//
// How the edge uses it:
//
//   - [Wanted] says whether a request is a browser navigation that should get the page at once.
//     Anything else (and a browser on a route with waiting_page off) is held as before.
//   - [New] loads a route's template ("" is the built-in page) and checks it by executing it against
//     sample data; its errors name the file and every problem found. A [Page] is immutable and safe
//     for concurrent use.
//   - [Page.Waiting] answers 503 with the waiting page; [Page.Failed] answers 503 with the failure
//     page (short cause, wake id, a retry link). Both send Retry-After, Cache-Control: no-store and a
//     Content-Security-Policy that allows only the page's own inline script and style, through a nonce
//     made fresh for each response. The page loads nothing else.
//   - [Events] streams a wake's progress from a [Source] (the edge's, or a [Progress]) as SSE on the
//     reserved path [EventsPath], which the edge serves on every host before routing by path.
//   - [History] keeps a route's recent wake durations; its [History.Expected] is the page's expected
//     wake time. The edge owns one per route.
//
// The page's script opens an EventSource on [View].EventsURL, shows each phase as it begins, the time
// elapsed and a progress bar against the expected time, and reloads the page's own URL on "ready"; on
// "failed" it shows the cause, the wake id and the retry link in place. When the stream breaks it
// reloads after Retry-After. Without JavaScript, a <meta http-equiv="refresh"> inside <noscript>
// reloads the same URL every Retry-After seconds until the edge serves the app; the failure page does
// not reload by itself, so an open tab does not keep waking a broken tenant.
//
// What strangers may read (docs/security.md): the route's name, the phase names, the wake id, the
// times, and the Cause the edge passes, which must be the short client message (the tenant's output
// only when the route sets detailed_errors). Every value is escaped by html/template, and in the event stream by encoding/json.
package waitpage

import (
	"mime"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Wanted reports whether r is a browser navigation that should get the waiting page at once rather
// than be held: a GET whose Accept lists text/html with a non-zero quality, sent either with
// Sec-Fetch-Mode: navigate (or the older nested-navigate) or with no fetch metadata at all (a browser
// before fetch metadata, or a person's curl -H 'Accept: text/html'). A prefetch or prerender
// (Sec-Purpose or Purpose naming prefetch) is not a person waiting and is held as before.
//
// A request that asks to upgrade its connection (an Upgrade field, whatever its value, or the
// "upgrade" connection option) is never a navigation, whatever its Accept and fetch metadata say: a
// WebSocket handshake is held until the tenant can answer it (no browser navigation sends either).
// Found with a WebSocket client that sent Accept: text/html and no fetch metadata: it got the page, which
// no such client can use. The edge takes an upgrade to HTTP itself (h2c) off a request before it asks
// (withoutHTTPUpgrade in internal/activator), so curl --http2 asking for HTML still gets the page.
func Wanted(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	h := r.Header
	if _, upgrade := h["Upgrade"]; upgrade || httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade") {
		return false
	}
	switch mode := h.Get("Sec-Fetch-Mode"); mode {
	case "":
		// No fetch metadata: Accept alone decides.
		if h.Get("Sec-Fetch-Dest") != "" || h.Get("Sec-Fetch-Site") != "" {
			return false // fetch metadata without a mode is no browser's navigation
		}
	case "navigate", "nested-navigate":
	default:
		return false
	}
	if purpose := h.Get("Sec-Purpose") + "," + h.Get("Purpose"); strings.Contains(strings.ToLower(purpose), "prefetch") {
		return false
	}
	return acceptsHTML(h.Values("Accept"))
}

// acceptsHTML reports whether the Accept header values list text/html with a quality above zero.
// A wildcard (*/*, text/*) does not count: every fetch sends */*.
func acceptsHTML(values []string) bool {
	for _, v := range values {
		for item := range strings.SplitSeq(v, ",") {
			media, params, err := mime.ParseMediaType(strings.TrimSpace(item))
			if err != nil || media != "text/html" {
				continue
			}
			if q, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(q, 64); err != nil || f <= 0 {
					continue
				}
			}
			return true
		}
	}
	return false
}
