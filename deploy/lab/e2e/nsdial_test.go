package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kiln/deploy/lab/testreq"
)

// The flow's dialer reaches a listener on a namespace's loopback that the
// host's own 127.0.0.1 does not have, and leaves the dialing goroutine's
// thread in the host namespace.
func TestNSDialerReachesTheNamespacesLoopback(t *testing.T) {
	testreq.Root(t, "creates a network namespace", "ip")
	ns := fmt.Sprintf("klnd%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}

	// A listener created inside the namespace, on a thread that enters it
	// and is then thrown away.
	lnc := make(chan net.Listener, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, err := os.Open(netnsDir + "/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			errc <- err
			return
		}
		lnc <- ln
	}()
	var ln net.Listener
	select {
	case ln = <-lnc:
	case err := <-errc:
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "inside\n")
			c.Close()
		}
	}()
	addr := ln.Addr().String()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s answered on the host's loopback: the test cannot tell the namespaces apart", addr)
	}
	for i := range 20 { // many dials: every thread that dialled is back home
		c, err := nsDialer(ns)(ctx, "tcp", addr)
		if err != nil {
			t.Fatalf("dial %d in %s: %v", i, ns, err)
		}
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(b) != "inside\n" {
			t.Fatalf("dial %d: read %q, %v", i, b, err)
		}
		if c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr); err == nil {
			c.Close()
			t.Fatalf("after dial %d a host dial reached the namespace: a thread stayed in it", i)
		}
	}
	if _, err := nsDialer("no-such-ns")(ctx, "tcp", addr); err == nil {
		t.Fatal("a missing namespace dialled")
	}
}
