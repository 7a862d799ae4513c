// Package swtpm runs a real software TPM 2.0 (the swtpm package's `swtpm
// socket`) for host-side tests of attestation (issue 16), and builds a TCG
// crypto-agile event log whose events it extends into that TPM, standing
// in for the firmware that measures a real boot.
//
// The TPM's state is made by `swtpm_setup --tpm2 --create-ek-cert` (an EK
// certificate from swtpm's local CA, in NV as on a real TPM; only the
// SHA-256 PCR bank is active). Commands travel over a Unix socket (swtpm's
// --server type=unixio: raw TPM 2.0 command and response buffers).
package swtpm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
	"unicode/utf16"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// TPM is one running swtpm.
type TPM struct {
	Dir  string // state, sockets, log
	sock string
	cmd  *exec.Cmd
	done chan struct{}

	mu  sync.Mutex
	log []byte // the event log of what Measure extended
}

// Available reports why swtpm cannot run here ("" when it can).
func Available() string {
	for _, c := range []string{"swtpm", "swtpm_setup"} {
		if _, err := exec.LookPath(c); err != nil {
			return c + " not installed (deploy/scripts/install-deps.sh installs swtpm, swtpm-tools)"
		}
	}
	return ""
}

// Start manufactures a new TPM in dir (EK certificate included) and starts
// swtpm on it. Close stops it.
func Start(dir string) (*TPM, error) {
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	setup := exec.Command("swtpm_setup", "--tpm2", "--tpmstate", state, "--create-ek-cert", "--overwrite")
	if out, err := setup.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("swtpm_setup: %v: %s", err, out)
	}
	t := &TPM{Dir: dir, sock: filepath.Join(dir, "tpm.sock")}
	if err := t.run(); err != nil {
		return nil, err
	}
	return t, nil
}

// run starts swtpm on the state in t.Dir (TPM2_Startup(CLEAR): the PCRs
// are reset) and waits for its socket; the event log starts again.
func (t *TPM) run() error {
	t.done = make(chan struct{})
	logf, err := os.OpenFile(filepath.Join(t.Dir, "swtpm.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_ = os.Remove(t.sock)
	t.cmd = exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+filepath.Join(t.Dir, "state"),
		"--server", "type=unixio,path="+t.sock, "--ctrl", "type=unixio,path="+filepath.Join(t.Dir, "ctrl.sock"),
		"--flags", "not-need-init,startup-clear")
	t.cmd.Stdout, t.cmd.Stderr = logf, logf
	if err := t.cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	cmd, done := t.cmd, t.done
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", t.sock)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Close()
			return fmt.Errorf("swtpm did not listen on %s: %v", t.sock, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.mu.Lock()
	t.log = specIDEvent()
	t.mu.Unlock()
	return nil
}

// Reboot is the machine's reset as its TPM sees it: swtpm is stopped and
// started again on the same state (the same EK and certificate), the PCRs
// start from zero and the event log from its first entry, as on a real
// platform reset. Connections opened before it are dead.
func (t *TPM) Reboot() error {
	t.Close()
	return t.run()
}

// Close stops swtpm.
func (t *TPM) Close() error {
	if t.cmd.Process != nil {
		_ = t.cmd.Process.Kill()
	}
	<-t.done
	return nil
}

// Open returns a new command channel to the TPM (one connection; swtpm
// serves one at a time: close it before opening the next). It implements
// go-attestation's CommandChannelTPM20: MeasurementLog returns the event
// log of what Measure extended so far.
func (t *TPM) Open() (*Conn, error) {
	c, err := net.Dial("unix", t.sock)
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, t: t}, nil
}

// Conn is one connection to swtpm. Read returns one whole TPM response.
type Conn struct {
	c   net.Conn
	t   *TPM
	buf []byte
}

func (c *Conn) Write(p []byte) (int, error) { return c.c.Write(p) }

// Read returns the next response: the 10-byte header's size says how much
// to wait for, so a response split across socket reads is whole.
func (c *Conn) Read(p []byte) (int, error) {
	if len(c.buf) == 0 {
		hdr := make([]byte, 10)
		if _, err := io.ReadFull(c.c, hdr); err != nil {
			return 0, err
		}
		size := binary.BigEndian.Uint32(hdr[2:6])
		if size < 10 || size > 1<<20 {
			return 0, fmt.Errorf("swtpm: response size %d", size)
		}
		body := make([]byte, size)
		copy(body, hdr)
		if _, err := io.ReadFull(c.c, body[10:]); err != nil {
			return 0, err
		}
		c.buf = body
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

// Close closes the connection (the TPM keeps running).
func (c *Conn) Close() error { return c.c.Close() }

// MeasurementLog returns the event log (go-attestation's CommandChannelTPM20).
func (c *Conn) MeasurementLog() ([]byte, error) { return c.t.EventLog(), nil }

// EventLog returns a copy of the event log of what Measure extended.
func (t *TPM) EventLog() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.log...)
}

// Event is one measurement: extended into PCR with SHA-256(Data) as its
// digest (Digest, when set, is extended instead, as firmware does for an
// image it hashed itself), logged with Type and Data.
type Event struct {
	PCR    int
	Type   uint32
	Data   []byte
	Digest []byte
}

// TCG event types used by firmware and the Linux EFI stub.
const (
	EvPostCode                = 0x00000001
	EvNoAction                = 0x00000003
	EvSeparator               = 0x00000004
	EvAction                  = 0x00000005
	EvEventTag                = 0x00000006
	EvSCRTMVersion            = 0x00000008
	EvIPL                     = 0x0000000D
	EvEFIVariableDriverConfig = 0x80000001
	EvEFIVariableBoot         = 0x80000002
	EvEFIBootServicesApp      = 0x80000003
	EvEFIAction               = 0x80000007
	EvEFIGPTEvent             = 0x80000006
)

// Measure extends each event into the TPM (TPM2_PCR_Extend, SHA-256 bank)
// and appends it to the event log.
func (t *TPM) Measure(events ...Event) error {
	c, err := t.Open()
	if err != nil {
		return err
	}
	defer c.Close()
	for _, e := range events {
		d := e.Digest
		if d == nil {
			s := sha256.Sum256(e.Data)
			d = s[:]
		}
		if err := tpm2.PCRExtend(c, tpmutil.Handle(e.PCR), tpm2.AlgSHA256, d, ""); err != nil {
			return fmt.Errorf("extend PCR %d: %w", e.PCR, err)
		}
		t.mu.Lock()
		t.log = append(t.log, logEvent(e.PCR, e.Type, d, e.Data)...)
		t.mu.Unlock()
	}
	return nil
}

// SetLog replaces the event log (a test that sends a log which does not
// replay, or an empty one).
func (t *TPM) SetLog(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log = append([]byte(nil), b...)
}

// LogEvent encodes one TCG_PCR_EVENT2 with a single SHA-256 digest (to
// build a log by hand; Measure uses it).
func LogEvent(pcr int, typ uint32, digest, data []byte) []byte {
	return logEvent(pcr, typ, digest, data)
}

// SpecIDEvent is the log's first entry (TCG_PCClientPCREvent with the
// Spec ID Event03 announcing the SHA-256 bank).
func SpecIDEvent() []byte { return specIDEvent() }

func logEvent(pcr int, typ uint32, digest, data []byte) []byte {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	w(uint32(pcr))
	w(typ)
	w(uint32(1))      // digest count
	w(uint16(0x000B)) // TPM_ALG_SHA256
	b.Write(digest)
	w(uint32(len(data)))
	b.Write(data)
	return b.Bytes()
}

func specIDEvent() []byte {
	var sp bytes.Buffer
	w := func(v any) { _ = binary.Write(&sp, binary.LittleEndian, v) }
	sp.WriteString("Spec ID Event03\x00")
	w(uint32(0)) // platform class
	w(uint8(0))  // spec version minor
	w(uint8(2))  // major
	w(uint8(0))  // errata
	w(uint8(2))  // uintn size
	w(uint32(1)) // algorithms
	w(uint16(0x000B))
	w(uint16(32))
	w(uint8(0)) // vendor info size
	var b bytes.Buffer
	wb := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	wb(uint32(0))
	wb(uint32(EvNoAction))
	b.Write(make([]byte, 20)) // SHA-1 sized digest of the legacy header
	wb(uint32(sp.Len()))
	b.Write(sp.Bytes())
	return b.Bytes()
}

// QEMU is a swtpm serving one qemu VM (its control channel; qemu's
// tpm-tis device sends the commands and the firmware measures the boot).
type QEMU struct {
	cmd  *exec.Cmd
	done chan struct{}
	// Args are the qemu arguments that attach it.
	Args []string
}

// StartQEMU starts swtpm for a VM on the TPM state in dir, manufacturing
// it (EK certificate included) when dir holds none, so a second boot of
// the same machine has the same TPM. Close stops it.
func StartQEMU(dir string) (*QEMU, error) {
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(state, "tpm2-00.permall")); err != nil {
		setup := exec.Command("swtpm_setup", "--tpm2", "--tpmstate", state, "--create-ek-cert", "--overwrite")
		if out, err := setup.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("swtpm_setup: %v: %s", err, out)
		}
	}
	sock := filepath.Join(dir, "qemu-ctrl.sock")
	_ = os.Remove(sock)
	logf, err := os.OpenFile(filepath.Join(dir, "swtpm-qemu.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	q := &QEMU{done: make(chan struct{})}
	q.cmd = exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+state, "--ctrl", "type=unixio,path="+sock)
	q.cmd.Stdout, q.cmd.Stderr = logf, logf
	if err := q.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() { _ = q.cmd.Wait(); logf.Close(); close(q.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			q.Close()
			return nil, fmt.Errorf("swtpm did not create %s", sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
	q.Args = []string{"-chardev", "socket,id=chrtpm,path=" + sock, "-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
		"-device", "tpm-tis,tpmdev=tpm0"}
	return q, nil
}

// Close stops swtpm.
func (q *QEMU) Close() error {
	if q.cmd.Process != nil {
		_ = q.cmd.Process.Kill()
	}
	<-q.done
	return nil
}

// UEFIBoot is a measured boot as OVMF and the Linux EFI stub record it,
// for a TPM that stands in for a machine's (host tests, the fleet
// simulator): the firmware version and code (PCR 0), configuration (1),
// the separators of PCRs 0–7, the boot loader (4), Secure Boot state (7),
// and in PCR 9 the initrd and the kernel command line cmdline (tagged
// events whose digest is the measured bytes', as the stub logs them: the
// command line as UTF-16LE with its NUL).
func UEFIBoot(cmdline string) []Event {
	sep := []byte{0, 0, 0, 0}
	ev := []Event{
		{PCR: 0, Type: EvSCRTMVersion, Data: UTF16Z("OVMF 2022.11")},
		{PCR: 0, Type: EvEFIVariableDriverConfig, Data: []byte("firmware volume FV_MAIN")},
		{PCR: 1, Type: EvEFIVariableBoot, Data: UTF16Z("BootOrder")},
		{PCR: 7, Type: EvEFIVariableDriverConfig, Data: UTF16Z("SecureBoot")},
	}
	for pcr := 0; pcr <= 7; pcr++ {
		ev = append(ev, Event{PCR: pcr, Type: EvSeparator, Data: sep})
	}
	bl := sha256.Sum256([]byte("BOOTX64.EFI image"))
	ev = append(ev, Event{PCR: 4, Type: EvEFIBootServicesApp, Data: []byte("\\EFI\\BOOT\\BOOTX64.EFI"), Digest: bl[:]})
	initrd := sha256.Sum256([]byte("initrd bytes"))
	ev = append(ev, Event{PCR: 9, Type: EvEventTag, Data: Tagged(0x8F3B22ED, "Linux initrd"), Digest: initrd[:]})
	cl := sha256.Sum256(UTF16Z(cmdline))
	return append(ev, Event{PCR: 9, Type: EvEventTag, Data: Tagged(0x8F3B22EC, "LOADED_IMAGE::LoadOptions"), Digest: cl[:]})
}

// Tagged is an EV_EVENT_TAG's data (TCG_PCClientTaggedEvent: the 32-bit
// tag id, the length, the NUL-terminated description), little-endian.
func Tagged(id uint32, desc string) []byte {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, id)
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(desc)+1))
	b.WriteString(desc + "\x00")
	return b.Bytes()
}

// UTF16Z is s as UTF-16LE with a terminating NUL (UEFI's CHAR16 strings).
func UTF16Z(s string) []byte {
	u := utf16.Encode([]rune(s + "\x00"))
	b := make([]byte, 2*len(u))
	for i, r := range u {
		binary.LittleEndian.PutUint16(b[2*i:], r)
	}
	return b
}
