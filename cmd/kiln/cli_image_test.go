package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"kiln/appliance"
)

// startInProcess runs a real appliance (embedded default on free loopback
// ports, no provisioning interface) and returns its API URL and admin token.
func startInProcess(t *testing.T) (string, string) {
	t.Helper()
	p := freePorts(t, 4)
	cfg := appliance.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr = fmt.Sprintf("127.0.0.1:%d", p[0])
	cfg.Raft.Addr = fmt.Sprintf("127.0.0.1:%d", p[1])
	cfg.Raft.ForwardAddr = fmt.Sprintf("127.0.0.1:%d", p[2])
	cfg.Boot.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", p[3])
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := appliance.New(cfg, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("appliance: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("appliance did not stop")
		}
	})
	base := "http://" + cfg.API.Addr
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("appliance not ready within 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	return base, strings.TrimSpace(string(tok))
}

// `kiln images upload x.raw.gz` / `x.raw.zst` (the README's example) works:
// the CLI sends the decompressed content's sha256 and size, which the
// appliance requires for compressed images. It used to fail with 400.
func TestCLIUploadCompressedImages(t *testing.T) {
	base, tok := startInProcess(t)
	e := &cliEnv{t: t, url: base}
	t.Setenv("KILN_TOKEN_FILE", filepath.Join(t.TempDir(), "none"))
	raw := bytes.Repeat([]byte("compressible disk image "), 20000)
	sum := sha256.Sum256(raw)
	dir := t.TempDir()
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	if _, err := gw.Write(raw); err != nil {
		t.Fatal(err)
	}
	must(t, gw.Close())
	zw, err := zstd.NewWriter(&zs)
	must(t, err)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	must(t, zw.Close())
	must(t, os.WriteFile(filepath.Join(dir, "a.raw.gz"), gz.Bytes(), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "b.raw.zst"), zs.Bytes(), 0o644))

	for _, f := range []string{"a.raw.gz", "b.raw.zst"} {
		out, stderr, err := e.run("--token", tok, "images", "upload", filepath.Join(dir, f), "--version", "1", "-q", "-o", "json")
		if err != nil {
			t.Fatalf("upload %s: %v\n%s", f, err, stderr)
		}
		var im struct {
			SHA256 string `json:"sha256"`
			Size   int    `json:"size_bytes"`
		}
		if err := json.Unmarshal([]byte(out), &im); err != nil {
			t.Fatalf("%s: %v\n%s", f, err, out)
		}
		if im.SHA256 != hex.EncodeToString(sum[:]) || im.Size != len(raw) {
			t.Fatalf("%s recorded %+v, want the decompressed content's digest and size %d", f, im, len(raw))
		}
	}
	// A --sha256 that is not the decompressed content's is caught before upload.
	bad := sha256.Sum256(zs.Bytes())
	if _, stderr, err := e.run("--token", tok, "images", "upload", filepath.Join(dir, "b.raw.zst"), "--name", "c", "--version", "1", "-q",
		"--sha256", hex.EncodeToString(bad[:])); err == nil || !strings.Contains(err.Error()+stderr, "decompressed") {
		t.Fatalf("wrong --sha256 for a zstd image: err %v %s", err, stderr)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
