package kvm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// monitor is one QMP connection. It bounds go-qemu's context-less Run with the caller's ctx: each
// command runs in a goroutine the monitor owns, which ends when QEMU replies or the connection closes;
// close joins them all.
type monitor struct {
	mon    *qmp.SocketMonitor
	events <-chan qmp.Event
	wg     sync.WaitGroup // commands still running
	once   sync.Once
}

// errBusy reports a QMP socket that accepts connections but never greets: another client holds it.
var errBusy = errors.New("QMP monitor does not greet (another client connected?)")

// dialError is dial's failure: ctx ended before the monitor greeted.
type dialError struct {
	sock string
	last error // the last attempt's error: refused, no such file, a monitor that does not greet
	err  error // ctx's error
}

func (e *dialError) Error() string {
	return fmt.Sprintf("qmp connect %s: %v (last error: %v)", e.sock, e.err, e.last)
}

func (e *dialError) Unwrap() error { return e.err }

// lastAttempt is the error of dial's last attempt when err is dial's, else err.
func lastAttempt(err error) error {
	var de *dialError
	if errors.As(err, &de) && de.last != nil {
		return de.last
	}
	return err
}

// dial connects to the QMP socket, retrying while QEMU creates it or refuses connections, until ctx
// ends (the caller bounds it with budgets.qmp). The events channel must be drained by the caller until
// it closes.
func dial(ctx context.Context, sock string, wg *sync.WaitGroup) (*monitor, error) {
	var last error
	d := 2 * time.Millisecond
	for {
		if err := probe(ctx, sock); err == nil {
			m, err := connect(ctx, sock, wg)
			if err == nil {
				return m, nil
			}
			last = err
		} else {
			last = err
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, &dialError{sock: sock, last: last, err: ctx.Err()}
		case <-t.C:
		}
		d = min(2*d, 100*time.Millisecond)
	}
}

// probe checks that the socket greets within a short time, so that go-qemu's Connect (which cannot be
// bounded) is only attempted on a monitor that is free.
func probe(ctx context.Context, sock string) error {
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(2 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetReadDeadline(deadline)
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return errBusy
		}
		return err
	}
	var greet struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if json.Unmarshal(line, &greet) != nil || greet.QMP == nil {
		return fmt.Errorf("not a QMP greeting: %.80q", line)
	}
	return nil
}

// connect runs go-qemu's handshake. Connect has no timeout: it runs in a goroutine, and when ctx ends
// first the goroutine (joined through wg) is left to finish on its own (the probe just saw a free
// monitor, so it does within moments) and disconnects what it got.
func connect(ctx context.Context, sock string, wg *sync.WaitGroup) (*monitor, error) {
	mon, err := qmp.NewSocketMonitor("unix", sock, 2*time.Second)
	if err != nil {
		return nil, err
	}
	type result struct{ err error }
	// Unbuffered: once connect has stopped listening, the goroutine takes abandon and cleans up.
	ch := make(chan result)
	abandon := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := mon.Connect()
		select {
		case ch <- result{err}:
		case <-abandon:
			if err == nil {
				_ = mon.Disconnect()
			}
		}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			_ = mon.Disconnect()
			return nil, fmt.Errorf("qmp handshake: %w", r.err)
		}
	case <-ctx.Done():
		close(abandon)
		// The handshake goroutine may be offering its result right now.
		select {
		case r := <-ch:
			if r.err == nil {
				_ = mon.Disconnect()
			}
		default:
		}
		return nil, ctx.Err()
	}
	ev, err := mon.Events(context.Background())
	if err != nil {
		_ = mon.Disconnect()
		return nil, err
	}
	return &monitor{mon: mon, events: ev}, nil
}

// run executes one QMP command and decodes its "return" into out (when non-nil), bounded by ctx.
func (m *monitor) run(ctx context.Context, out any, cmd string, args any) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	b, err := json.Marshal(qmp.Command{Execute: cmd, Args: args})
	if err != nil {
		return err
	}
	type result struct {
		raw []byte
		err error
	}
	ch := make(chan result, 1)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		raw, err := m.mon.Run(b)
		ch <- result{raw, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("qmp %s: %w", cmd, r.err)
		}
		if out == nil {
			return nil
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
		}
		if err := json.Unmarshal(r.raw, &resp); err != nil {
			return fmt.Errorf("qmp %s: decode reply: %w", cmd, err)
		}
		if err := json.Unmarshal(resp.Return, out); err != nil {
			return fmt.Errorf("qmp %s: decode reply: %w", cmd, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

// close disconnects and joins the command goroutines (a disconnect ends any that still wait for a
// reply). The event channel closes as a result; its reader must keep draining it until then. close
// must not be called from the goroutine draining the events.
func (m *monitor) close() {
	m.once.Do(func() { _ = m.mon.Disconnect() })
	m.wg.Wait()
}
