package kvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// A file-mode device state (tens of KB) travels between QEMU and the backend over a unix socket in the
// runtime dir (migration URI unix:), not through an exec: helper: QEMU forking a shell and cat costs
// more than the whole save, and the backend sees the stream end instead of polling for a file.

// receiveDevice runs the outgoing migration of inst into file: it listens on the route's migration
// socket, tells QEMU to migrate there, and copies the stream into file's temp file until QEMU closes
// the connection, hashing it on the way, all before deadline. Once the migration has completed, the
// temp file is renamed to file.
func (b *Backend) receiveDevice(ctx context.Context, inst *instance, file string, deadline time.Time) (devSidecar, error) {
	_ = os.Remove(b.p.mig)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: b.p.mig, Net: "unix"})
	if err != nil {
		return devSidecar{}, fmt.Errorf("migration socket: %w", err)
	}
	defer ln.Close() // and unlinks the socket
	_ = ln.SetDeadline(deadline)
	if err := inst.migrate(ctx, "migrate", "unix:"+b.p.mig); err != nil {
		return devSidecar{}, err
	}
	dev, rerr := receiveStream(ln, file+".tmp", deadline)
	err = waitMigrated(ctx, inst)
	switch {
	case rerr != nil && err != nil:
		// The stream failed on our side (a full disk), so QEMU's failed too: ours is the cause.
		return devSidecar{}, fmt.Errorf("receive the device state: %w (and so the %w)", rerr, err)
	case err != nil:
		return devSidecar{}, err
	case rerr != nil:
		return devSidecar{}, fmt.Errorf("receive the device state: %w", rerr)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		return devSidecar{}, err
	}
	return dev, nil
}

// receiveStream accepts one connection on ln and copies it into file until EOF, before deadline.
func receiveStream(ln *net.UnixListener, file string, deadline time.Time) (devSidecar, error) {
	c, err := ln.AcceptUnix()
	if err != nil {
		return devSidecar{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	f, err := os.OpenFile(file, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return devSidecar{}, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), c)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return devSidecar{Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}, err
}

// waitMigrated waits for the outgoing migration's end: nil once it completed.
func waitMigrated(ctx context.Context, inst *instance) error {
	return inst.waitFor(ctx, func(_, m string) (bool, error) {
		switch m {
		case "completed":
			return true, nil
		case "failed", "cancelled":
			return false, fmt.Errorf("migration %s", m)
		}
		return false, nil
	})
}

// sendDevice starts the incoming migration of a QEMU started with -incoming defer on the route's
// migration socket (QEMU listens there) and writes file into it, before ctx ends.
func (b *Backend) sendDevice(ctx context.Context, inst *instance, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_ = os.Remove(b.p.mig)
	defer os.Remove(b.p.mig)
	if err := inst.migrate(ctx, "migrate-incoming", "unix:"+b.p.mig); err != nil {
		return err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", b.p.mig)
	if err != nil {
		return fmt.Errorf("migration socket: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.Copy(c, f); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("send the device state: %w", err)
	}
	return nil
}
