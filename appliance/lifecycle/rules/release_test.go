package rules

import (
	"strings"
	"testing"

	"kiln/store"
)

func TestTokenBits(t *testing.T) {
	for tok, want := range map[string][2]float64{ // [min, max]
		"9f86d081884c7d659a2feaa0c55ad015":  {128, 128},
		"aaaaaaaaaaaaaaaa":                  {0, 0},
		"abcdabcdabcdabcd":                  {32, 32},
		"Tr0ub4dor&3-correct-horse-battery": {128, 300},
		"0123456789abcdef":                  {64, 64},
		"abcdef.0123456789abcdef":           {64, 160},
	} {
		if got := TokenBits(tok); got < want[0]-0.01 || got > want[1]+0.01 {
			t.Errorf("TokenBits(%q) = %.1f, want %v..%v", tok, got, want[0], want[1])
		}
	}
}

func TestCheckCluster(t *testing.T) {
	good := "9f86d081884c7d659a2feaa0c55ad015"
	for _, tc := range []struct {
		cl       store.ClusterSpec
		tok      string
		set      bool
		field    string
		wantHost string
	}{
		{store.ClusterSpec{Role: "worker", ControlPlaneHost: "cp.example", KubernetesVersion: "v1.31.2"}, good, false, "", "cp.example:6443"},
		{store.ClusterSpec{Role: "worker", ControlPlaneHost: "10.0.0.1:7443", KubernetesVersion: "v1.31.2"}, good, false, "", "10.0.0.1:7443"},
		{store.ClusterSpec{Role: "control-plane", ControlPlaneHost: "fd00::1", KubernetesVersion: "v1.31.2"}, good, false, "", "[fd00::1]:6443"},
		{store.ClusterSpec{Role: "init", KubernetesVersion: "v1.31.2"}, good, false, "", ""},
		{store.ClusterSpec{Role: "init", KubernetesVersion: "v1.31.2"}, "", true, "", ""}, // the stored token stays
		{store.ClusterSpec{Role: "init", KubernetesVersion: "v1.31.2"}, "", false, "c.cluster_token", ""},
		{store.ClusterSpec{Role: "init", KubernetesVersion: "v1.31.2"}, good[:15], false, "c.cluster_token", ""},
		{store.ClusterSpec{Role: "init", KubernetesVersion: "v1.31.2"}, strings.Repeat("a", MaxTokenLen+1), false, "c.cluster_token", ""},
		{store.ClusterSpec{Role: "init", KubernetesVersion: "latest"}, good, false, "c.kubernetesVersion", ""},
		{store.ClusterSpec{Role: "etcd", KubernetesVersion: "v1.31.2"}, good, false, "c.role", ""},
		{store.ClusterSpec{Role: "worker", KubernetesVersion: "v1.31.2"}, good, false, "c.control_plane_host", ""},
		{store.ClusterSpec{Role: "worker", ControlPlaneHost: "bad host", KubernetesVersion: "v1.31.2"}, good, false, "c.control_plane_host", ""},
	} {
		cl := tc.cl
		err := CheckCluster("c", &cl, tc.tok, tc.set)
		var fe *FieldError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v", tc.cl, err)
		case tc.field != "" && (err == nil || !asField(err, &fe) || fe.Field != tc.field):
			t.Errorf("%+v: %v, want a %s error", tc.cl, err, tc.field)
		case tc.field == "" && cl.ControlPlaneHost != tc.wantHost:
			t.Errorf("%+v: host %q, want %q", tc.cl, cl.ControlPlaneHost, tc.wantHost)
		}
		if err != nil && tc.tok != "" && strings.Contains(err.Error(), tc.tok) {
			t.Errorf("error shows the token: %v", err)
		}
	}
}

func asField(err error, fe **FieldError) bool {
	f, ok := err.(*FieldError)
	*fe = f
	return ok
}
