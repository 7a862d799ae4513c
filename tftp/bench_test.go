package tftp

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ipxebin "github.com/tinkerbell/ipxedust/binary"

	"kiln/deploy/lab/benchline"
)

// TestBenchBoot (KILN_BENCH=1): 200 parallel fetches of ipxe.efi over TFTP
// (curl, blksize 1468) from a network namespace, against Kiln and against
// dnsmasq's TFTP server on the same veth link, in the same run.
func TestBenchBoot(t *testing.T) {
	benchline.Need(t, true, "ip", "curl", "dnsmasq")
	const clients = 200
	l := newLink(t, 3, 1500)
	peerIP := "10.72.3.3"
	run(t, "ip", "addr", "add", peerIP+"/24", "dev", hostVeth(t, l))

	_, _ = startServer(t, Config{MaxTransfers: 256}, l.hostIP+":69")

	root := t.TempDir()
	must(t, os.WriteFile(filepath.Join(root, "ipxe.efi"), ipxebin.Files["ipxe.efi"], 0o644))
	dm := exec.Command("dnsmasq", "-k", "--conf-file=/dev/null", "--port=0", "--enable-tftp", "--tftp-root="+root,
		"--tftp-max=250", "--bind-interfaces", "--listen-address="+peerIP, "--user=root", "--group=root",
		"--pid-file="+filepath.Join(root, "dnsmasq.pid"), "--log-facility="+filepath.Join(root, "dnsmasq.log"))
	must(t, dm.Start())
	t.Cleanup(func() { dm.Process.Kill(); dm.Wait() })
	time.Sleep(300 * time.Millisecond)

	fetch := func(ip string) float64 {
		script := fmt.Sprintf(`for i in $(seq %d); do curl -sS -o /dev/null --tftp-blksize 1468 -w '%%{size_download} %%{time_total}\n' tftp://%s/ipxe.efi || echo FAIL$? & done; wait`, clients, ip)
		start := time.Now()
		out, err := exec.Command("ip", "netns", "exec", l.ns, "sh", "-c", script).CombinedOutput()
		d := time.Since(start).Seconds()
		if err != nil {
			t.Fatalf("%s: %v\n%s", ip, err, out)
		}
		ok := 0
		for _, f := range strings.Fields(string(out)) {
			if n, _ := strconv.Atoi(f); n == len(ipxebin.Files["ipxe.efi"]) {
				ok++
			}
		}
		if ok != clients {
			t.Fatalf("%s: %d of %d fetches complete\n%s", ip, ok, clients, out)
		}
		return d
	}
	fetch(l.hostIP) // warm-up (page cache, ARP)
	fetch(peerIP)
	var kiln, peer float64
	for i := 0; i < 3; i++ { // interleaved, best of 3
		k, p := fetch(l.hostIP), fetch(peerIP)
		if i == 0 || k < kiln {
			kiln = k
		}
		if i == 0 || p < peer {
			peer = p
		}
	}
	benchline.Print(t, benchline.Line{Name: "tftp_200_parallel_seconds", Unit: "s", Kiln: kiln, Peer: &benchline.Peer{What: "dnsmasq-tftp", Value: peer}})
}

// hostVeth finds the host end of l's veth pair by its address.
func hostVeth(t *testing.T, l netnsLink) string {
	out, err := exec.Command("ip", "-o", "addr", "show", "to", l.hostIP+"/32").Output()
	if err != nil || len(strings.Fields(string(out))) < 2 {
		t.Fatalf("host veth for %s: %v %q", l.hostIP, err, out)
	}
	return strings.Fields(string(out))[1]
}
