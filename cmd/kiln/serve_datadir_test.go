package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeRefusesFSMWithoutRaftDB: `kiln serve` on a data directory whose
// raft.db is gone but whose fsm.db holds machines must not start. It used
// to bootstrap a new empty cluster, report ready with no machines and
// replace fsm.db without a word. Now it exits non-zero naming raft.db,
// fsm.db and the data directory with the ways to recover, leaves every file
// as it was, and starts with all machines once raft.db is put back. With
// fsm.db gone instead (raft.db present), it rebuilds fsm.db and starts.
func TestServeRefusesFSMWithoutRaftDB(t *testing.T) {
	n := newServeNode(t, "dd-1", nil)
	s := n.start(t)
	var ids []string
	for i := 0; i < 5; i++ {
		var m struct {
			ID string `json:"id"`
		}
		code, err := s.do("POST", "/v1/machines", map[string]any{"name": fmt.Sprintf("dd-%d", i),
			"intended": map[string]any{"nics": []map[string]string{{"mac": fmt.Sprintf("02:00:00:00:dd:%02x", i)}}}}, &m)
		if err != nil || code != http.StatusCreated {
			t.Fatalf("create: %d %v", code, err)
		}
		ids = append(ids, m.ID)
	}
	stopServe(t, s)

	storeDir := filepath.Join(n.data, "store")
	raftPath, fsmPath := filepath.Join(storeDir, "raft.db"), filepath.Join(storeDir, "fsm.db")
	savedRaft, err := os.ReadFile(raftPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(raftPath); err != nil {
		t.Fatal(err)
	}
	fsmBefore, err := os.ReadFile(fsmPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, n.bin, "serve", "--config", n.cfg).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("kiln serve did not refuse (err %v, ctx %v):\n%s", err, ctx.Err(), out)
	}
	msg := string(out)
	t.Logf("kiln serve with raft.db missing:\n%s", msg)
	for _, want := range []string{raftPath + " is missing", fsmPath + " holds state up to raft index", storeDir,
		"restore " + raftPath, "move fsm.db, snapshots/ out of " + storeDir, "Nothing was changed"} {
		if !strings.Contains(msg, want) {
			t.Errorf("start-up error lacks %q", want)
		}
	}
	if strings.Contains(msg, "panic") {
		t.Errorf("start-up panicked:\n%s", msg)
	}
	if after, err := os.ReadFile(fsmPath); err != nil || !bytes.Equal(after, fsmBefore) {
		t.Errorf("fsm.db changed by the refused start (%v)", err)
	}
	if _, err := os.Stat(raftPath); !os.IsNotExist(err) {
		t.Errorf("the refused start created %s (%v)", raftPath, err)
	}

	// Put raft.db back: every machine is there.
	if err := os.WriteFile(raftPath, savedRaft, 0o600); err != nil {
		t.Fatal(err)
	}
	s = n.start(t)
	for _, id := range ids {
		if code, err := s.do("GET", "/v1/machines/"+id, nil, nil); err != nil || code != http.StatusOK {
			t.Errorf("machine %s after restoring raft.db: %d %v", id, code, err)
		}
	}
	stopServe(t, s)

	// fsm.db gone, raft.db present: rebuilt from the log, nothing lost.
	if err := os.Remove(fsmPath); err != nil {
		t.Fatal(err)
	}
	s = n.start(t)
	for _, id := range ids {
		if code, err := s.do("GET", "/v1/machines/"+id, nil, nil); err != nil || code != http.StatusOK {
			t.Errorf("machine %s after removing fsm.db: %d %v", id, code, err)
		}
	}
	stopServe(t, s)
}

func stopServe(t *testing.T, s *served) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	if err := s.cmd.Wait(); err != nil {
		t.Fatalf("kiln serve exit after SIGTERM: %v\n%s", err, s.log)
	}
}
