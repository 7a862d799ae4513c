package testreq

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestHelperMissing is not a test on its own: TestMissingPolicy re-runs the
// test binary with KILN_TESTREQ_HELPER set, and this asks for a command that
// does not exist.
func TestHelperMissing(t *testing.T) {
	if os.Getenv("KILN_TESTREQ_HELPER") == "" {
		t.Skip("helper process for TestMissingPolicy")
	}
	switch os.Getenv("KILN_TESTREQ_HELPER") {
	case "command":
		Commands(t, "kiln-no-such-command") // deps-check:absent (no package provides it, on purpose)
	case "rootcommand":
		Root(t, "the policy test", "sh", "kiln-no-such-command") // deps-check:absent (no package provides it, on purpose)
	case "repofile":
		RepoFile(t, "deploy/lab/testreq/no-such-file")
	case "envdir":
		Env(t)
	}
	t.Log("requirement met")
}

// TestMissingPolicy: a missing host command (on its own, or one a root test
// drives, which also skips when not root) skips without KILN_REQUIRE_ALL and
// fails with KILN_REQUIRE_ALL=1; a missing repository file and an empty
// KILN_ENV_DIR fail either way.
func TestMissingPolicy(t *testing.T) {
	empty := t.TempDir()
	for _, tc := range []struct {
		helper, requireAll, envDir string
		want                       string
	}{
		{"command", "", "", "--- SKIP"},
		{"command", "1", "", "--- FAIL"},
		{"rootcommand", "", "", "--- SKIP"},
		{"rootcommand", "1", "", "--- FAIL"},
		{"repofile", "", "", "--- FAIL"},
		{"envdir", "", empty, "--- FAIL"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMissing$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "KILN_TESTREQ_HELPER="+tc.helper, RequireAllEnv+"="+tc.requireAll, EnvDirEnv+"="+tc.envDir)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("%s with %s=%q %s=%q: want %s, got:\n%s", tc.helper, RequireAllEnv, tc.requireAll, EnvDirEnv, tc.envDir, tc.want, out)
		}
	}
	if !strings.HasSuffix(RepoFile(t, "go.mod"), "/go.mod") {
		t.Error("RepoFile(go.mod): wrong path")
	}
}
