package agent

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/benchline"
)

// TestBenchAgentWriteVerifyHost (KILN_BENCH=1, root): on the host, into a loop device, the
// agent's write step and verify step (writeImage: HTTP stream → pwrite with SHA-256
// alongside, fsync; readBack: O_DIRECT re-read and SHA-256) against the standard tools
// doing the same work — `curl -s URL | dd of=DEV bs=4M iflag=fullblock conv=fsync`, then
// `blockdev --flushbufs DEV` (so the digest is of the medium, as the agent's O_DIRECT
// read) and `sha256sum DEV` — measured in the same run, from the same loopback HTTP server
// (net/http ServeContent of a file), into loop devices of the image's exact size backed by
// files in the same directory. Rounds alternate the two; each side's median is printed,
// as bytes of image per second of write+verify (ratio ≥ 1 means the agent is at least as
// fast). The agent's I/O before issue 15 (page-cache writes, read-back reading and hashing
// in turn) runs in the same rounds and has its own line. KILN_BENCH_HOST_MIB sets the
// image size (default 256).
func TestBenchAgentWriteVerifyHost(t *testing.T) {
	benchline.Need(t, true, "losetup", "curl", "dd", "sha256sum", "blockdev")
	mib := 256
	if v, err := strconv.Atoi(os.Getenv("KILN_BENCH_HOST_MIB")); err == nil && v > 0 {
		mib = v
	}
	size := int64(mib) << 20
	dir := t.TempDir()
	imgPath := filepath.Join(dir, "image.raw")
	f, err := os.Create(imgPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := fileSHA(t, imgPath)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, imgPath)
	}))
	defer srv.Close()
	url := srv.URL + "/image.raw"

	a, err := New(Config{URL: srv.URL, MachineID: "bench", RetryBase: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	old, err := New(Config{URL: srv.URL, MachineID: "bench", RetryBase: 10 * time.Millisecond, pageCacheIO: true})
	if err != nil {
		t.Fatal(err)
	}
	ref := &agentapi.ImageRef{URL: url, SHA256: want, Size: uint64(size), Format: "raw"}
	ctx := context.Background()

	agentRun := func(a *Agent) float64 {
		dev, _ := newLoop(t, size, nil)
		d, err := OpenDevice(dev)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		start := time.Now()
		crc, _, _, err := a.writeImage(ctx, ref, time.Hour, d, 0)
		if err != nil {
			t.Fatalf("agent write: %v", err)
		}
		got, rcrc, err := a.readBack(ctx, agentapi.StepVerify, time.Hour, d, 0, size, nil)
		el := time.Since(start).Seconds()
		if err != nil || got != want || rcrc != crc {
			t.Fatalf("agent verify: %v (sha %s, crc32c %08x, the stream's %08x)", err, got, rcrc, crc)
		}
		return float64(size) / el
	}
	peerRun := func() float64 {
		dev, _ := newLoop(t, size, nil)
		start := time.Now()
		out, err := exec.Command("sh", "-c", fmt.Sprintf("curl -sf %s | dd of=%s bs=4M iflag=fullblock conv=fsync status=none && blockdev --flushbufs %s && sha256sum %s", url, dev, dev, dev)).CombinedOutput()
		el := time.Since(start).Seconds()
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Fatalf("peer: %v: %s", err, out)
		}
		return float64(size) / el
	}
	const rounds = 3
	var ak, ok, pk []float64
	for i := 0; i < rounds; i++ {
		pk = append(pk, peerRun())
		ak = append(ak, agentRun(a))
		ok = append(ok, agentRun(old))
		t.Logf("round %d: agent %.1f MB/s, agent with page-cache I/O (before) %.1f MB/s, peer %.1f MB/s", i+1, ak[i]/1e6, ok[i]/1e6, pk[i]/1e6)
	}
	benchline.Print(t, benchline.Line{Name: "agent_write_verify_host_pagecache_bytes_per_s", Unit: "bytes/s", Kiln: median(ok),
		Peer:   &benchline.Peer{What: "curl|dd+sha256sum", Value: median(pk)},
		Fields: []benchline.Field{{Key: "note", Value: "the-agent's-I/O-before-issue-15:page-cache-writes,serial-read-back"}, {Key: "image_mib", Value: strconv.Itoa(mib)}}})
	benchline.Print(t, benchline.Line{Name: "agent_write_verify_host_bytes_per_s", Unit: "bytes/s", Kiln: median(ak),
		Peer:   &benchline.Peer{What: "curl|dd+sha256sum", Value: median(pk)},
		Fields: []benchline.Field{{Key: "image_mib", Value: strconv.Itoa(mib)}, {Key: "target", Value: "loop"}, {Key: "rounds", Value: strconv.Itoa(rounds)}}})
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
