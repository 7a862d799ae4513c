package tftp

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ipxebin "github.com/tinkerbell/ipxedust/binary"

	"kiln/deploy/lab/benchline"
	"kiln/deploy/lab/testkit"
)

// TestBenchBoot (KILN_BENCH=1): 200 parallel fetches of ipxe.efi over TFTP
// (curl, blksize 1468) from a network namespace, against Kiln and against
// dnsmasq's TFTP server on the same veth link, in the same run.
func TestBenchBoot(t *testing.T) {
	benchline.Need(t, true, "ip", "curl", "dnsmasq")
	const clients = 200
	l := testkit.NewLink(t, "kbt-t", netip.MustParsePrefix("10.72.3.0/24"), 1500)
	peerIP := "10.72.3.3"
	testkit.IP(t, "addr", "add", peerIP+"/24", "dev", l.HostIf)

	_, _ = startServer(t, Config{MaxTransfers: 256}, l.HostIP+":69")

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
		out, err := exec.Command("ip", "netns", "exec", l.NS, "sh", "-c", script).CombinedOutput()
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
	fetch(l.HostIP) // warm-up (page cache, ARP)
	fetch(peerIP)
	var kiln, peer float64
	for i := 0; i < 3; i++ { // interleaved, best of 3
		k, p := fetch(l.HostIP), fetch(peerIP)
		if i == 0 || k < kiln {
			kiln = k
		}
		if i == 0 || p < peer {
			peer = p
		}
	}
	benchline.Print(t, benchline.Line{Name: "tftp_200_parallel_seconds", Unit: "s", Kiln: kiln, Peer: &benchline.Peer{What: "dnsmasq-tftp", Value: peer}})
}
