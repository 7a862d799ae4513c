package store_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// TestCrashHelperWriter is not a test on its own: TestCrashKill re-runs the
// test binary with KILN_STORE_CRASH_DIR set, and this writes machines in a
// loop, printing "ack ID" after each acknowledged write, until killed.
func TestCrashHelperWriter(t *testing.T) {
	dir := os.Getenv("KILN_STORE_CRASH_DIR")
	if dir == "" {
		t.Skip("helper process for TestCrashKill")
	}
	cfg := storetest.Config("solo", dir)
	cfg.Bootstrap = true
	cfg.SnapshotThreshold = 200 // snapshots happen during the run too
	cfg.SnapshotInterval = 100 * time.Millisecond
	cfg.TrailingLogs = 50
	s, err := store.Open(cfg, storetest.Logger(), nil)
	if err != nil {
		fmt.Println("open error:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	if err := s.WaitLeader(ctx); err != nil {
		os.Exit(3)
	}
	fmt.Println("ready")
	for i := 0; ; i++ {
		m, err := s.PutMachine(ctx, store.Machine{Intended: store.Hardware{NICs: []store.NIC{{MAC: mac(i)}}}}, store.W{Actor: "crash"})
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println("ack", m.ID)
	}
}

// TestCrashKill: a process writing to the store is killed with SIGKILL in
// the middle of a stream of writes; reopening the data directory gives
// back every acknowledged write (fsm.db is rebuilt from snapshot + log).
func TestCrashKill(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelperWriter$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KILN_STORE_CRASH_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	var acked []string
	sc := bufio.NewScanner(out)
	deadline := time.Now().Add(30 * time.Second)
	for sc.Scan() {
		line := sc.Text()
		if id, ok := strings.CutPrefix(line, "ack "); ok {
			acked = append(acked, id)
		}
		if strings.HasPrefix(line, "open error") {
			t.Fatal(line)
		}
		if len(acked) >= 400 || time.Now().After(deadline) {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Drain what was already printed: those writes were acknowledged too.
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "ack "); ok {
			acked = append(acked, id)
		}
	}
	_ = cmd.Wait()
	killed = true
	if len(acked) < 50 {
		t.Fatalf("only %d writes acknowledged before the kill", len(acked))
	}
	s, _ := openSingle(t, dir, nil)
	if !waitTrue(15*time.Second, s.Ready) {
		t.Fatal("not ready after crash restart")
	}
	for _, id := range acked {
		if _, err := s.GetMachine(id); err != nil {
			t.Fatalf("acknowledged write %s lost after SIGKILL: %v", id, err)
		}
	}
	t.Logf("%d acknowledged writes present after SIGKILL; stats last_snapshot_index=%s", len(acked), s.Stats()["last_snapshot_index"])
}
