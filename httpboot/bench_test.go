package httpboot

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kiln/deploy/lab/benchline"
)

// TestBenchBoot (KILN_BENCH=1): a 2 GiB (sparse) image over HTTP on
// loopback to 1 and to 20 parallel curl clients (all 20 fetch the same
// file, each its first 1 GiB), Kiln vs Debian's nginx (sendfile on) in the
// same run; plus the resident memory of each while serving 20 clients.
func TestBenchBoot(t *testing.T) {
	benchline.Need(t, false, "curl", "nginx")
	const size = 2 << 30
	// Each of the 20 parallel clients reads the first 1 GiB of the same
	// 2 GiB image (20 GiB per run) to keep the benchmark under two minutes.
	const per20 = 1 << 30
	e := startHTTP(t, "127.0.0.1:0", nil)
	img := filepath.Join(e.srv.Catalog().Dir(), "big.img")
	f, err := os.Create(img)
	must(t, err)
	must(t, f.Truncate(size))
	f.Close()
	start := time.Now()
	if _, err := e.srv.Catalog().List(); err != nil { // hash once (ETag), outside the timing
		t.Fatal(err)
	}
	t.Logf("first SHA-256 of 2 GiB: %s", time.Since(start))

	ngx := startNginx(t, e.srv.Catalog().Dir())
	kurl := e.base + "/images/big.img"
	purl := ngx.base + "/big.img"

	// fetch runs n parallel curls, each reading the first per bytes of url.
	fetch := func(url string, n int, per int64) float64 {
		script := fmt.Sprintf(`for i in $(seq %d); do curl -sS -r 0-%d -o /dev/null -w '%%{size_download}\n' %s & done; wait`, n, per-1, url)
		start := time.Now()
		out, err := exec.Command("sh", "-c", script).CombinedOutput()
		d := time.Since(start).Seconds()
		if err != nil {
			t.Fatalf("%s: %v\n%s", url, err, out)
		}
		ok := 0
		for _, s := range strings.Fields(string(out)) {
			if v, _ := strconv.ParseInt(s, 10, 64); v == per {
				ok++
			}
		}
		if ok != n {
			t.Fatalf("%s: %d of %d complete\n%s", url, ok, n, out)
		}
		return float64(n) * float64(per) / d
	}
	fetch(kurl, 1, size) // warm the page cache
	k1, p1 := fetch(kurl, 1, size), fetch(purl, 1, size)
	k1b, p1b := fetch(kurl, 1, size), fetch(purl, 1, size)
	k1, p1 = max(k1, k1b), max(p1, p1b)
	benchline.Print(t, benchline.Line{Name: "http_image_1client_bytes_per_s", Unit: "bytes/s", Kiln: k1, Peer: &benchline.Peer{What: "nginx-sendfile", Value: p1}})

	rssBefore := rssOf(t, os.Getpid())
	var kPeak, pPeak int64
	var k20, p20 float64
	for i := 0; i < 2; i++ { // interleaved, best of 2
		kc, pc := cpuOf(os.Getpid()), ngx.cpu()
		k := sampling(func() float64 { return fetch(kurl, 20, per20) }, func() { kPeak = max(kPeak, rssOf(t, os.Getpid())) })
		kc = cpuOf(os.Getpid()) - kc
		p := sampling(func() float64 { return fetch(purl, 20, per20) }, func() { pPeak = max(pPeak, ngx.rss(t)) })
		pc = ngx.cpu() - pc
		t.Logf("20 clients round %d: kiln %.0f B/s (%.1f CPU s), nginx %.0f B/s (%.1f CPU s)", i, k, kc, p, pc)
		k20, p20 = max(k20, k), max(p20, p)
	}
	rssAfter := rssOf(t, os.Getpid())
	benchline.Print(t, benchline.Line{Name: "http_image_20clients_bytes_per_s", Unit: "bytes/s", Kiln: k20, Peer: &benchline.Peer{What: "nginx-sendfile", Value: p20}})
	// Kiln's RSS is the whole test process (the Go test runtime and this
	// test's own data included); nginx's is its master and workers. The
	// test process's growth over the 20-client rounds (0 or less: none) is a
	// field of the line, not a figure.
	benchline.Print(t, benchline.Line{Name: "http_rss_bytes", Unit: "bytes", Kiln: float64(kPeak), Peer: &benchline.Peer{What: "nginx-sendfile", Value: float64(pPeak)},
		Fields: []benchline.Field{{Key: "kiln_growth_bytes", Value: fmt.Sprint(rssAfter - rssBefore)}, {Key: "note", Value: "kiln-rss-is-the-test-process"}}})
	t.Logf("kiln RSS before %d, peak %d, after %d (test process, includes the Go test runtime)", rssBefore, kPeak, rssAfter)
}

// sampling runs work while calling sample every 100 ms.
func sampling(work func() float64, sample func()) float64 {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			sample()
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	v := work()
	cancel()
	wg.Wait()
	return v
}

// rssOf reads VmRSS of pid in bytes.
func rssOf(t testing.TB, pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0 // process gone
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// cpuOf returns utime+stime of pid in seconds (USER_HZ 100).
func cpuOf(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

func (n *nginx) cpu() float64 {
	total := cpuOf(n.cmd.Process.Pid)
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", n.cmd.Process.Pid, n.cmd.Process.Pid))
	for _, c := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(c)
		total += cpuOf(pid)
	}
	return total
}

type nginx struct {
	base string
	cmd  *exec.Cmd
}

// rss sums the resident memory of the nginx master and its workers.
func (n *nginx) rss(t testing.TB) int64 {
	total := rssOf(t, n.cmd.Process.Pid)
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", n.cmd.Process.Pid, n.cmd.Process.Pid))
	for _, c := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(c)
		total += rssOf(t, pid)
	}
	return total
}

// startNginx serves dir on a free loopback port with a config in a temp dir.
func startNginx(t testing.TB, dir string) *nginx {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := ln.Addr().String()
	ln.Close()
	tmp := t.TempDir()
	conf := fmt.Sprintf(`daemon off;
user root;
master_process on;
worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  default_type application/octet-stream;
  server { listen %[2]s; root %[3]s; }
}
`, tmp, addr, dir)
	must(t, os.WriteFile(filepath.Join(tmp, "nginx.conf"), []byte(conf), 0o644))
	cmd := exec.Command("nginx", "-c", filepath.Join(tmp, "nginx.conf"), "-p", tmp)
	cmd.Stderr = os.Stderr
	// Its own process group: the workers must end with the master (a SIGKILLed
	// master leaves them running).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, cmd.Start())
	t.Cleanup(func() {
		pgid := cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM) // nginx's fast shutdown, workers included
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // whatever is left of the group
		<-done
	})
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &nginx{base: "http://" + addr, cmd: cmd}
}
