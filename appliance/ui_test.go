package appliance

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"kiln/api"
	"kiln/api/ui"
)

// TestUIAcrossNodes: `kiln serve` serves the web UI on its API listener
// (GET / goes to it), and a session signed in on one node of the site is
// accepted by another: the cookie is sealed under the site key every
// member holds, with no server-side session record. The site configures
// the same operator token on both nodes, as a site does for its API
// tokens.
func TestUIAcrossNodes(t *testing.T) {
	const opTok = "ui-operator-token"
	tokens := func(c *Config) {
		c.API.Tokens = append(c.API.Tokens, TokenSpec{Name: "ops", Role: "operator", SHA256: api.HashToken(opTok)})
	}
	a := startNode(t, "kiln-a", nil, tokens)
	a.waitReady(t)
	b := startNode(t, "kiln-b", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a), tokens)
	b.waitReady(t)

	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noFollow.Get("http://" + a.cfg.API.Addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusFound || res.Header.Get("Location") != ui.Prefix {
		t.Fatalf("GET /: %d %q", res.StatusCode, res.Header.Get("Location"))
	}
	// Sign in on a.
	base := "http://" + a.cfg.API.Addr
	req, _ := http.NewRequest("POST", base+"/ui/login", strings.NewReader(url.Values{"token": {opTok}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	res, err = noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	var cookie *http.Cookie
	for _, c := range res.Cookies() {
		if c.Name == ui.CookieName {
			cookie = c
		}
	}
	if res.StatusCode != http.StatusSeeOther || cookie == nil {
		t.Fatalf("sign-in on a: %d, cookie %v", res.StatusCode, cookie)
	}
	// The cookie works on both nodes.
	for _, n := range []*node{a, b} {
		req, _ := http.NewRequest("GET", "http://"+n.cfg.API.Addr+"/ui/", nil)
		req.AddCookie(cookie)
		res, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "Site overview") || !strings.Contains(string(body), "ops") {
			t.Fatalf("overview on %s with a's cookie: %d", n.cfg.NodeID, res.StatusCode)
		}
		if !strings.Contains(string(body), "kiln-a") || !strings.Contains(string(body), "kiln-b") {
			t.Fatalf("overview on %s does not list both members", n.cfg.NodeID)
		}
	}
}
