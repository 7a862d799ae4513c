package appliance

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/appliance/lifecycle"
	"kiln/bmc"
	"kiln/deploy/lab/ipmilab"
	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
	"kiln/store"
	"kiln/store/storetest"
)

// TestIPMIAutoInspection: a registered machine whose BMC is a real OpenIPMI
// ipmi_sim (started by ipmilab in its own network namespace "klc-PID",
// address on the namespace's loopback) is driven by the lifecycle controller
// through the appliance's own bmcAdapter (sealed credential in a real store,
// opened with a real bmc.Sealer) and kiln/bmc over ipmitool: the chassis
// program sees "next boot PXE" then "power on", and the machine goes
// inspecting with two succeeded jobs. The "server" the chassis program starts
// is a sleep process (the VM boot itself is covered by kiln/bmc's and the
// lab's qemu tests).
func TestIPMIAutoInspection(t *testing.T) {
	if testing.Short() {
		t.Skip("short: ipmi_sim")
	}
	testreq.Root(t, "a network namespace and ipmi_sim", "ip", "ipmi_sim", "ipmitool", "setsid")
	labDir := filepath.Dir(testreq.RepoFile(t, "deploy/lab/ipmi/lan.conf.in"))
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	const user, pass, addr = "kilnlc", "Lc-Secret-75x", "10.75.1.2"
	ns := fmt.Sprintf("klc-%d", os.Getpid()%100000)
	state := t.TempDir()
	testkit.Netns(t, ns)
	testkit.IP(t, "-n", ns, "addr", "add", addr+"/24", "dev", "lo")

	logs := func() {
		for _, n := range []string{"ipmi_sim.log", "chassis.log", "boots.log"} {
			b, _ := os.ReadFile(filepath.Join(state, n))
			t.Logf("--- %s:\n%s", n, b)
		}
	}
	// The chassis program appends -qmp/-serial/-boot arguments: sh -c ignores them.
	sim, err := ipmilab.Start(context.Background(), ipmilab.Options{NetNS: ns, Name: "klc", Addr: addr,
		User: user, Password: pass, StateDir: state, LabDir: labDir,
		QEMUArgs: []string{"/bin/sh", "-c", "exec sleep 120", "fake-server"}, DieWithParent: true})
	if err != nil {
		logs()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sim.Close() // also kills the fake servers by their pids in boots.log
		if t.Failed() {
			logs()
		}
	})
	// ipmitool must run inside the namespace: a wrapper kiln/bmc can exec
	// (absolute paths: it passes only IPMITOOL_PASSWORD in the environment).
	ipPath, _ := exec.LookPath("ip")
	itPath, _ := exec.LookPath("ipmitool")
	wrapper := filepath.Join(state, "ipmitool-netns")
	check(os.WriteFile(wrapper, []byte(fmt.Sprintf("#!/bin/sh\nexec %s netns exec %s %s \"$@\"\n", ipPath, ns, itPath)), 0o700))

	ctl, err := bmc.New(bmc.Config{CallTimeout: 15 * time.Second, BackoffBase: 200 * time.Millisecond, IPMICipherSuite: "3",
		IpmitoolPath: wrapper, IPMIIgnoreValidBit: true}, prometheus.NewRegistry())
	check(err)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	sealer, err := bmc.NewSealer(key)
	check(err)
	st := storetest.NewCluster(t, 1).Nodes[0].Store
	c, err := lifecycle.New(lifecycle.Config{ImageBaseURL: "http://10.99.0.1:8080", Interval: 100 * time.Millisecond,
		Sealer: sealerAdapter{sealer}}, st, &bmcAdapter{st: st, sealer: sealer, ctl: ctl}, prometheus.NewRegistry())
	check(err)
	ctx := context.Background()
	res, err := c.Import(ctx, strings.NewReader("name,macs,boot_mode\nipmi-1,52:54:00:75:01:02,legacy\n"), "csv", store.W{Actor: "test"})
	check(err)
	id := res.IDs[0]
	_, err = c.EnrollBMC(ctx, id, store.BMC{Address: addr, Driver: "ipmi", Username: user}, pass, store.W{Actor: "test"})
	check(err)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, nil) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(60 * time.Second)
	var m store.Machine
	for {
		m, err = st.GetMachine(id)
		check(err)
		if m.State == store.StateInspecting || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if m.State != store.StateInspecting || m.Reason != lifecycle.ReasonInspectionStarted {
		jobs, _ := st.ListJobs(id)
		t.Fatalf("machine %s reason %q %q; jobs %+v", m.State, m.Reason, m.Message, jobs)
	}
	if boots := sim.Boots(); len(boots) != 1 || !strings.Contains(boots[0], "boot=pxe") {
		t.Fatalf("chassis starts %q: want one start with boot=pxe", boots)
	}
	jobs, err := st.ListJobs(id)
	check(err)
	kinds := map[string]string{}
	for _, j := range jobs {
		kinds[j.Kind] = j.State
	}
	if len(jobs) != 2 || kinds[lifecycle.JobBootPXE] != lifecycle.JobSucceeded || kinds[lifecycle.JobPowerCycle] != lifecycle.JobSucceeded {
		t.Fatalf("jobs %+v", jobs)
	}
}
