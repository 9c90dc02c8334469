package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/activator/activator/internal/activator"
)

// TestStalledClientsGiveBackUpstreamSlots: clients that ask for a large answer and never read it
// hold their route's upstream connection slots only until edge.send_timeout. Measured on 64fda5b
// (no such bound): a route with max_upstream_conns 4 and 4 such clients (an 8 MiB echo each)
// answered every other request 503 at its hold.max_time, still 60 s later. Here the route has 2
// slots and 2 stalled clients, and a plain GET sent once both are in flight must get its 200 when
// the timeout (5s, long enough that the status poll sees both in flight) has cut them off. Its
// hold.max_time, 20s, only stops a failing test.
func TestStalledClientsGiveBackUpstreamSlots(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		name := "HTTP/1.1"
		if h2c {
			name = "h2c"
		}
		t.Run(name, func(t *testing.T) { testStalledClients(t, h2c) })
	}
}

// testStalledClients is TestStalledClientsGiveBackUpstreamSlots over HTTP/1.1, or over h2c, where the
// stalled client is one that reads its connection but never its answer's body: net/http's transport
// then grants the stream no more flow-control window once its buffer is full, and the edge's stream
// waits for window, not for the socket.
func testStalledClients(t *testing.T, h2c bool) {
	app := appRoute{Name: "stalled", HoldMaxTime: "20s"}
	routes := strings.Replace(configYAML(t, app), "    backing: exec\n", "    backing: exec\n    max_upstream_conns: 2\n", 1)
	s := startServed(t, "edge: {send_timeout: 5s}\n"+routes)
	get := func(what string) { t.Helper(); getOK(t, s.edge, app.host(), what) }
	get("waking the route")

	body := strings.Repeat("x", 8<<20) // far more than the kernel buffers between the edge and a client that reads nothing
	if h2c {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr := &http.Transport{Protocols: &p}
		defer tr.CloseIdleConnections()
		for i := range 2 {
			req, _ := http.NewRequest(http.MethodPost, "http://"+s.edge+"/echo", strings.NewReader(body))
			req.Host = app.host()
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatalf("stalled h2c client %d: %v", i, err)
			}
			defer resp.Body.Close() // never read
		}
	}
	for i := range 2 {
		if h2c {
			break
		}
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		}}
		c, err := d.Dial("tcp", s.edge)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", app.host(), len(body), body); err != nil {
			t.Fatalf("stalled client %d: %v", i, err)
		}
	}
	s.waitStatus(app.Name, "serving the two stalled clients", func(st activator.Status) bool { return st.InFlight == 2 })
	get("after two clients stalled on the route's two slots")
}
