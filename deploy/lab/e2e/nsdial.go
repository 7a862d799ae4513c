package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add NAME` binds a namespace (ip-netns(8)).
const netnsDir = "/run/netns"

// nsHTTPClient returns an HTTP client whose connections are opened inside
// the named network namespace, so the flow reaches Kiln's API on that
// namespace's 127.0.0.1 as the CLI inside it would. No proxy is used; the
// caller's context bounds each request.
func nsHTTPClient(ns string) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = nsDialer(ns)
	tr.ExpectContinueTimeout = time.Second
	return &http.Client{Transport: tr}
}

// nsDialer dials from inside namespace ns: on a goroutine locked to its OS
// thread it enters ns (setns(2) with CLONE_NEWNET), creates and connects the
// socket there (a socket stays in the namespace it was created in), and
// returns the thread to its own namespace. A thread that cannot be returned
// stays locked and ends with its goroutine, so no other goroutine ever runs
// in ns.
func nsDialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	path := filepath.Join(netnsDir, ns)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			c, restored, err := dialIn(ctx, path, network, addr)
			if restored {
				runtime.UnlockOSThread()
			}
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// dialIn runs on a locked thread: it enters the namespace at path, dials,
// and goes back. restored is false when the thread could not go back.
func dialIn(ctx context.Context, path, network, addr string) (c net.Conn, restored bool, err error) {
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return nil, true, fmt.Errorf("netns: own namespace: %w", err)
	}
	defer self.Close()
	target, err := os.Open(path)
	if err != nil {
		return nil, true, fmt.Errorf("netns %s: %w (is the lab up?)", path, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("netns: enter %s: %w", path, err)
	}
	var d net.Dialer
	c, err = d.DialContext(ctx, network, addr)
	if rerr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); rerr != nil {
		if c != nil {
			c.Close()
		}
		return nil, false, fmt.Errorf("netns: return from %s: %w", path, rerr)
	}
	return c, true, err
}
