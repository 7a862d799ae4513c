// Package testreq is the one home of the rule for what a test may skip. Tests
// call it instead of t.Skip for anything they need from outside the test:
//
//   - Provided by the repository, or by the make target that runs the tests
//     (a file or testdata capture in the repository, the in-RAM environment
//     under $KILN_ENV_DIR that `make unit` builds first, the environment build
//     itself): never a skip. Missing or broken, the test fails (RepoFile, Env).
//   - Absent by circumstance on a developer's machine (not root, a host
//     command or Debian package that deploy/scripts/install-deps.sh installs
//     is not there): a skip naming what is missing and where it comes from —
//     unless KILN_REQUIRE_ALL=1, under which it is a failure (Root, Commands,
//     HostFile, Missing). The Makefile's unit and e2e targets set
//     KILN_REQUIRE_ALL=1, so `make test` and CI (root, install-deps run
//     first) fail instead of skipping a test they are meant to run.
//   - Opt-in runs (KILN_BENCH=1 benchmarks, KILN_E2E=1 VM runs that `make e2e`
//     starts, -short) are not requirements: those tests skip with how to run
//     them, and this package is not involved.
//
// The package is imported by test code only (and by deploy/lab test helpers
// such as qemuvm).
package testreq

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// RequireAllEnv is the environment variable that turns circumstantial skips
// into failures when set to "1".
const RequireAllEnv = "KILN_REQUIRE_ALL"

// RequireAll reports whether $KILN_REQUIRE_ALL is "1".
func RequireAll() bool { return os.Getenv(RequireAllEnv) == "1" }

// Missing skips t with the message (format, args as fmt.Sprintf), or fails
// it when RequireAll: the one place a circumstantial requirement is decided.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if RequireAll() {
		t.Fatalf(format+" (%s=1: a test that this run must execute cannot be skipped)", append(args, RequireAllEnv)...)
	}
	t.Skipf(format, args...)
}

// Root requires the effective user to be root; why says what for (e.g.
// "network namespaces"). cmds are the host commands the test drives as root
// (ip, losetup, ...), required as by Commands once root is.
func Root(t testing.TB, why string, cmds ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
	Commands(t, cmds...)
}

// Commands requires each named command to be found by exec.LookPath (a name
// or an absolute path). Missing commands come from the Debian packages that
// deploy/scripts/install-deps.sh installs.
func Commands(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			Missing(t, "needs %s: not installed (deploy/scripts/install-deps.sh)", n)
		}
	}
}

// HostFile requires a file of the host that a Debian package provides (pkg
// names it, e.g. OVMF firmware from "ovmf").
func HostFile(t testing.TB, path, pkg string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, "needs %s (package %s, deploy/scripts/install-deps.sh): %v", path, pkg, err)
	}
}

// RepoRoot returns the repository root (the directory holding go.mod).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "../../.."))
}

// RepoFile returns the absolute path of rel (a path relative to the
// repository root) and fails t when it does not exist: a file the
// repository holds is never a reason to skip.
func RepoFile(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(RepoRoot(), rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is part of the repository and must be present: %v", rel, err)
	}
	return p
}

// EnvDirEnv names the directory of a built in-RAM environment (vmlinuz,
// initramfs), as `make unit` sets it after `make env`.
const EnvDirEnv = "KILN_ENV_DIR"

// envTools are the commands deploy/env/build.sh runs (besides go).
var envTools = []string{"apt-cache", "apt-get", "dpkg", "cpio", "gzip", "flock", "/bin/busybox", "/sbin/modinfo"}

// Env returns the kernel and initramfs of the in-RAM environment. With
// $KILN_ENV_DIR set, they are taken from there and must exist (a failure
// otherwise: the make target that set it built them). Without it, the
// environment is built by deploy/env/build.sh into a temporary directory, so
// a VM runs the agent code under test; the build's tools are circumstantial
// (Commands), but a failing build is a failure, with its output.
func Env(t testing.TB) (kernel, initrd string) {
	t.Helper()
	dir := os.Getenv(EnvDirEnv)
	if dir == "" {
		Commands(t, envTools...)
		dir = BuildEnv(t)
	}
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs")
	for _, f := range []string{kernel, initrd} {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			t.Fatalf("in-RAM environment %s: %s missing or empty (%v): run `make env`", dir, filepath.Base(f), err)
		}
	}
	return kernel, initrd
}

// BuildEnv runs deploy/env/build.sh into a new temporary directory and
// returns it; a failing build fails t with the script's output.
func BuildEnv(t testing.TB) string {
	t.Helper()
	Commands(t, envTools...)
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(RepoRoot(), "deploy/env/build.sh"))
	cmd.Env = append(os.Environ(), "KILN_ENV_OUT="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("deploy/env/build.sh failed: %v\n%s", err, out)
	}
	return dir
}
