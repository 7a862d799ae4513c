// Package alerts holds the tests of Kiln's Prometheus alert rules (kiln-alerts.yml).
package alerts

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"kiln/deploy/lab/testreq"
)

type ruleFile struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Alert       string
			Expr        string
			Labels      map[string]string
			Annotations map[string]string
		}
	}
}

type testFile struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	}
}

func load(t *testing.T, rel string, v any) []byte {
	t.Helper()
	b, err := os.ReadFile(testreq.RepoFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return b
}

// TestAlertRules checks kiln-alerts.yml with promtool (syntax, PromQL, templates) and
// runs its unit tests (kiln-alerts_test.yml); then checks that every alert has a case
// where it fires and one where it does not, a severity, a summary and a README section,
// and that every metric a rule reads is in README.md's table and registered where the
// table says.
func TestAlertRules(t *testing.T) {
	var rules ruleFile
	load(t, "deploy/prometheus/kiln-alerts.yml", &rules)
	var tests testFile
	load(t, "deploy/prometheus/kiln-alerts_test.yml", &tests)
	readme, err := os.ReadFile(testreq.RepoFile(t, "deploy/prometheus/README.md"))
	if err != nil {
		t.Fatal(err)
	}

	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	metricRe := regexp.MustCompile(`\bkiln_[a-z0-9_]+`)
	used := map[string]bool{}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" {
				t.Errorf("group %s: a rule without alert name (recording rules belong elsewhere)", g.Name)
				continue
			}
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["runbook"] != "deploy/prometheus/README.md#"+strings.ToLower(r.Alert) {
				t.Errorf("%s: annotations %v: want a summary and runbook pointing at its README section", r.Alert, r.Annotations)
			}
			if !strings.Contains(string(readme), "### "+r.Alert+"\n") {
				t.Errorf("%s: no section in README.md", r.Alert)
			}
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: kiln-alerts_test.yml must show it firing (%t) and not firing (%t)", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
			for _, m := range metricRe.FindAllString(r.Expr, -1) {
				used[m] = true
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules in kiln-alerts.yml")
	}
	rowRe := regexp.MustCompile("(?m)^\\| `(kiln_[a-z0-9_]+)` \\|[^|]*\\|[^|]*\\| ([^|]+) \\|$")
	rows := map[string]string{}
	for _, m := range rowRe.FindAllStringSubmatch(string(readme), -1) {
		rows[m[1]] = strings.TrimSpace(m[2])
	}
	for m := range used {
		src, ok := rows[m]
		switch {
		case !ok:
			t.Errorf("metric %s is read by a rule but not in README.md's table", m)
		case strings.HasPrefix(src, "pending"):
			t.Logf("metric %s: %s (not checked against the code yet)", m, src)
		default:
			b, err := os.ReadFile(testreq.RepoFile(t, src))
			if err != nil || !strings.Contains(string(b), `"`+m+`"`) {
				t.Errorf("metric %s: README says %s registers it, but the name is not there (%v)", m, src, err)
			}
		}
	}
	for m := range rows {
		if !used[m] {
			t.Errorf("README.md lists %s, which no rule reads", m)
		}
	}

	testreq.Commands(t, "promtool")
	dir := filepath.Dir(testreq.RepoFile(t, "deploy/prometheus/kiln-alerts.yml"))
	for _, args := range [][]string{{"check", "rules", "kiln-alerts.yml"}, {"test", "rules", "kiln-alerts_test.yml"}} {
		cmd := exec.Command("promtool", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s: %s", strings.Join(args, " "), strings.Join(strings.Fields(string(out)), " "))
	}
}
