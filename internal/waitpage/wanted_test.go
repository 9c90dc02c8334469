package waitpage

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Header sets as the browsers send them (Chromium 156, Firefox 140, Safari 15 before fetch metadata),
// and as other clients do.
const (
	chromeAccept  = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7"
	firefoxAccept = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
)

func TestWanted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		header map[string]string
		want   bool
	}{
		{"chromium navigation", "GET", map[string]string{
			"Accept": chromeAccept, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document",
			"Sec-Fetch-Site": "none", "Sec-Fetch-User": "?1", "Upgrade-Insecure-Requests": "1"}, true},
		{"firefox navigation", "GET", map[string]string{
			"Accept": firefoxAccept, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", "Sec-Fetch-Site": "same-origin"}, true},
		{"chromium iframe navigation", "GET", map[string]string{
			"Accept": chromeAccept, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe", "Sec-Fetch-Site": "same-origin"}, true},
		{"old chromium nested-navigate", "GET", map[string]string{
			"Accept": chromeAccept, "Sec-Fetch-Mode": "nested-navigate", "Sec-Fetch-Dest": "iframe"}, true},
		{"safari 15, no fetch metadata", "GET", map[string]string{"Accept": firefoxAccept}, true},
		{"curl asking for html", "GET", map[string]string{"Accept": "text/html"}, true},
		{"accept with spaces and params", "GET", map[string]string{"Accept": "application/json , text/html ; level=1 ; q=0.5"}, true},

		{"form post navigation", "POST", map[string]string{
			"Accept": chromeAccept, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, false},
		{"head", "HEAD", map[string]string{"Accept": chromeAccept, "Sec-Fetch-Mode": "navigate"}, false},
		{"chromium fetch()", "GET", map[string]string{
			"Accept": "*/*", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Sec-Fetch-Site": "same-origin"}, false},
		{"fetch() asking for html", "GET", map[string]string{
			"Accept": "text/html", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Sec-Fetch-Site": "same-origin"}, false},
		{"xhr same-origin mode", "GET", map[string]string{"Accept": "text/html", "Sec-Fetch-Mode": "same-origin"}, false},
		{"image", "GET", map[string]string{
			"Accept": "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}, false},
		{"stylesheet", "GET", map[string]string{"Accept": "text/css,*/*;q=0.1", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "style"}, false},
		{"event source", "GET", map[string]string{"Accept": "text/event-stream", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}, false},
		{"websocket", "GET", map[string]string{
			"Upgrade": "websocket", "Connection": "Upgrade", "Sec-Fetch-Mode": "websocket", "Sec-Fetch-Dest": "websocket"}, false},
		// A WebSocket handshake is never a navigation, whatever else it sends: found with a client that
		// sent Accept: text/html and no fetch metadata, which got the page instead of its socket.
		{"websocket accepting html", "GET", map[string]string{
			"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Accept": "text/html"}, false},
		{"websocket with java's default accept", "GET", map[string]string{
			"Upgrade": "websocket", "Connection": "Upgrade", "Accept": "text/html, image/gif, image/jpeg, *; q=.2, */*; q=.2"}, false},
		{"websocket claiming a navigation", "GET", map[string]string{
			"Upgrade": "websocket", "Connection": "Upgrade", "Accept": chromeAccept, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, false},
		{"websocket upgrade without the connection option", "GET", map[string]string{"Upgrade": "WebSocket", "Accept": "text/html"}, false},
		{"any other upgrade", "GET", map[string]string{"Upgrade": "foo/2", "Connection": "upgrade", "Accept": "text/html"}, false},
		{"an empty upgrade", "GET", map[string]string{"Upgrade": " , ", "Connection": "upgrade", "Accept": "text/html"}, false},
		{"the upgrade connection option alone", "GET", map[string]string{"Connection": "keep-alive, Upgrade", "Accept": "text/html"}, false},
		{"connection options without upgrade", "GET", map[string]string{"Connection": "keep-alive", "Accept": "text/html"}, true},
		{"upgrade-insecure-requests is no upgrade", "GET", map[string]string{
			"Accept": chromeAccept, "Sec-Fetch-Mode": "navigate", "Upgrade-Insecure-Requests": "1"}, true},
		{"curl default", "GET", map[string]string{"Accept": "*/*"}, false},
		{"no accept", "GET", nil, false},
		{"html refused", "GET", map[string]string{"Accept": "text/html;q=0, */*"}, false},
		{"html with a bad quality", "GET", map[string]string{"Accept": "text/html;q=x"}, false},
		{"fetch metadata without a mode", "GET", map[string]string{"Accept": "text/html", "Sec-Fetch-Site": "cross-site"}, false},
		{"chromium prefetch", "GET", map[string]string{
			"Accept": chromeAccept, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", "Sec-Purpose": "prefetch;prerender"}, false},
		{"firefox link prefetch", "GET", map[string]string{"Accept": firefoxAccept, "Purpose": "prefetch"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "http://app.test/", nil)
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			if got := Wanted(r); got != tc.want {
				t.Errorf("Wanted(%s %v) = %v, want %v", tc.method, tc.header, got, tc.want)
			}
		})
	}
}

func TestWantedSeveralAcceptLines(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "http://app.test/", nil)
	r.Header.Add("Accept", "application/json")
	r.Header.Add("Accept", "text/html")
	if !Wanted(r) {
		t.Errorf("Wanted with Accept split over two lines = false, want true")
	}
}
