package testkit

import (
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// InNetns runs fn on an OS thread switched into the network namespace ns
// (one Netns made, under /var/run/netns), then switches the thread back.
// Sockets fn opens stay in ns for their whole life, so a server can listen
// inside a namespace while the test process stays in its own. It fails t
// when the namespace cannot be entered or left (a thread that cannot be
// switched back is not reused: it ends with its goroutine).
func InNetns(t testing.TB, ns string, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- fmt.Errorf("namespace %s: %w", ns, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("enter namespace %s: %w", ns, err)
			return
		}
		fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("leave namespace %s: %w", ns, err) // thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
