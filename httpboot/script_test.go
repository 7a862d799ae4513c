package httpboot

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
)

var testParams = ScriptParams{
	BaseURL: "http://10.72.2.1:8080", AgentURL: "http://10.72.2.1:9090",
	KernelArgs:   []string{"console=ttyS0,115200"},
	FetchTimeout: 20 * time.Second, FetchRetries: 4, RetryDelay: 1500 * time.Millisecond,
}

func TestScriptAgent(t *testing.T) {
	s, err := Script(testParams, Boot{Action: ActionAgent, MachineID: "m-0042", Token: "tok_AbC-123.x~y+z/w=",
		ExtraArgs: []string{"kiln.debug=1"}, Hostname: "node-7.rack3"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"#!ipxe\n",
		"kernel --name vmlinuz --timeout 20000 http://10.72.2.1:8080/env/vmlinuz initrd=initramfs kiln.url=http://10.72.2.1:9090 kiln.machine=m-0042 kiln.token=tok_AbC-123.x~y+z/w= console=ttyS0,115200 kiln.debug=1 || goto kiln-wait\n",
		"initrd --name initramfs --timeout 20000 http://10.72.2.1:8080/env/initramfs || goto kiln-wait\n",
		"boot || goto kiln-wait\n",
		"iseq ${kiln-try} 4 && goto kiln-fail ||\n",
		"sleep 2\n",
		"host node-7.rack3\n",
		"reboot\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "dhcp") || strings.Contains(s, "ifconf") || strings.Contains(s, "autoboot") {
		t.Errorf("script re-runs network configuration:\n%s", s)
	}
}

func TestScriptLocalAndDiscover(t *testing.T) {
	s, err := Script(testParams, Boot{Action: ActionLocal, Hostname: "db-1 ${evil}"})
	if err != nil {
		t.Fatal(err)
	}
	if s != "#!ipxe\n# kiln: action=local\necho Kiln: booting db-1___evil_ from local disk\nexit 1\n" {
		t.Fatalf("local script:\n%s", s)
	}
	s, err = Script(testParams, Boot{Action: ActionDiscover})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s, "kiln.machine") || strings.Contains(s, "kiln.token") || !strings.Contains(s, "kiln.url=http://10.72.2.1:9090") {
		t.Fatalf("discover script:\n%s", s)
	}
}

func TestScriptRefusesUnsafe(t *testing.T) {
	for _, b := range []Boot{
		{Action: ActionAgent, MachineID: "m1 kiln.token=x", Token: "t"},
		{Action: ActionAgent, MachineID: "m1", Token: "t${net0/mac}"},
		{Action: ActionAgent, MachineID: "m1", Token: "t\nshell"},
		{Action: ActionAgent, MachineID: "m1", Token: "t || shell"},
		{Action: ActionAgent, MachineID: "m1", Token: "t", ExtraArgs: []string{"a=b&&shell"}},
		{Action: ActionAgent, MachineID: "m1", Token: "t", ExtraArgs: []string{"a=\"b\""}},
		{Action: ActionAgent, MachineID: "m1", Token: "t", ExtraArgs: []string{""}},
		{Action: ActionAgent, MachineID: "", Token: "t"},
		{Action: ActionAgent, MachineID: "m1", Token: ""},
		{Action: ActionAgent, MachineID: "m1", Token: "t#x"},
		{Action: ActionAgent, MachineID: "m1", Token: "t", ExtraArgs: []string{"kiln.machine=m2"}},
		{Action: ActionAgent, MachineID: "m1", Token: "t", ExtraArgs: []string{"kiln.token=stolen"}},
	} {
		if _, err := Script(testParams, b); !errors.Is(err, ErrUnsafeValue) {
			t.Errorf("%+v: err = %v, want ErrUnsafeValue", b, err)
		}
	}
	if _, err := Script(testParams, Boot{Action: "shell"}); !errors.Is(err, ErrBadAction) {
		t.Errorf("bad action: %v", err)
	}
}

// scriptLine lists the only line shapes the renderer may produce; a value
// that broke out of its slot would produce a line matching none of them.
var scriptLine = regexp.MustCompile(`^(#!ipxe|# kiln: action=(agent|discover|local)` +
	`|echo Kiln: provisioning environment for (machine [A-Za-z0-9._:-]+|discovery) host [A-Za-z0-9._-]*` +
	`|echo Kiln: booting [A-Za-z0-9._-]* from local disk|exit 1` +
	`|set kiln-try:int32 0|:kiln-retry|:kiln-wait|:kiln-fail|inc kiln-try|imgfree|boot \|\| goto kiln-wait` +
	`|iseq \$\{kiln-try\} \d+ && goto kiln-fail \|\|` +
	`|kernel --name vmlinuz --timeout \d+ \S+/env/vmlinuz( [A-Za-z0-9._:/=,+@%~-]+)+ \|\| goto kiln-wait` +
	`|initrd --name initramfs --timeout \d+ \S+/env/initramfs \|\| goto kiln-wait` +
	`|echo Kiln: attempt \$\{kiln-try\} of \d+ failed, retrying in \d+ s|sleep \d+|goto kiln-retry` +
	`|echo Kiln: giving up after \d+ attempts, rebooting|reboot)$`)

// FuzzScript: whatever the backend hands over, the script is either refused
// or made only of the renderer's own line shapes, with each value exactly
// where it belongs and no iPXE metacharacter anywhere.
func FuzzScript(f *testing.F) {
	f.Add("agent", "m-1", "tok", "host", "console=ttyS0")
	f.Add("agent", "m1", "t${x}", "h", "a")
	f.Add("discover", "", "", "h\nshell", "a b")
	f.Add("local", "x", "y", "${net0/ip}", "")
	f.Add("agent", "m1", "t", "h", "x||shell")
	f.Add("agent", "m1\n:kiln-fail", "t", "h", "ok")
	f.Add("agent", "m1", "t", "h", "kiln.machine=m2")
	f.Fuzz(func(t *testing.T, action, id, token, host, arg string) {
		b := Boot{Action: action, MachineID: id, Token: token, Hostname: host}
		if arg != "" {
			b.ExtraArgs = []string{arg}
		}
		s, err := Script(testParams, b)
		if err != nil {
			if !errors.Is(err, ErrUnsafeValue) && !errors.Is(err, ErrBadAction) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if !strings.HasSuffix(s, "\n") {
			t.Fatal("no final newline")
		}
		for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
			if !scriptLine.MatchString(line) {
				t.Fatalf("unexpected line %q for %+v", line, b)
			}
			if strings.Contains(line, "${") && !strings.Contains(line, "${kiln-try}") {
				t.Fatalf("expansion in %q", line)
			}
		}
		if action == ActionLocal {
			return
		}
		k := regexp.MustCompile(`(?m)^kernel .*$`).FindString(s)
		fields := strings.Fields(k)
		var got []string
		for _, f := range fields {
			if strings.HasPrefix(f, "kiln.machine=") || strings.HasPrefix(f, "kiln.token=") {
				got = append(got, f)
			}
		}
		var want []string
		if action == ActionAgent || id != "" {
			want = append(want, "kiln.machine="+id)
		}
		if action == ActionAgent || token != "" {
			want = append(want, "kiln.token="+token)
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("kernel args %q, want %q", got, want)
		}
		if arg != "" && fields[len(fields)-4] != arg {
			t.Fatalf("extra arg %q not in its slot: %q", arg, fields)
		}
	})
}
