package ui

import (
	"net/http"
	"strings"
	"time"
)

type loginPage struct {
	Next    string
	Expired bool
}

// safeNext keeps a post-sign-in redirect inside the UI.
func safeNext(n string) string {
	if !strings.HasPrefix(n, Prefix) || strings.HasPrefix(n, "//") || strings.ContainsAny(n, "\\\r\n") {
		return Prefix
	}
	return n
}

func (u *UI) loginPage(w http.ResponseWriter, r *http.Request) {
	pg := &loginPage{Next: safeNext(r.URL.Query().Get("next")), Expired: r.URL.Query().Get("expired") == "1"}
	u.render(w, http.StatusOK, "login", &layout{Title: "Sign in", Page: pg}, principal{})
}

// login exchanges a Kiln API token for a session cookie.
func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	next := safeNext(r.PostFormValue("next"))
	if !sameOrigin(r) {
		u.render(w, http.StatusForbidden, "login", &layout{Title: "Sign in", Error: "cross-origin sign-in refused",
			Page: &loginPage{Next: next}}, principal{})
		return
	}
	tok := strings.TrimSpace(r.PostFormValue("token"))
	name, role, ok := u.cfg.API.Authenticate(tok)
	if tok == "" || !ok {
		u.log.Info("sign-in refused", "remote", r.RemoteAddr)
		u.render(w, http.StatusUnauthorized, "login", &layout{Title: "Sign in", Error: "that token is not a Kiln API token of this site",
			Page: &loginPage{Next: next}}, principal{})
		return
	}
	csrf, err := newCSRF()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s := session{Token: tok, CSRF: csrf, Expires: u.cfg.Now().Add(u.cfg.SessionTTL).Unix()}
	if err := u.setSession(w, s); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	u.log.Info("signed in", "user", name, "role", role, "expires", time.Unix(s.Expires, 0).UTC())
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (u *UI) logout(w http.ResponseWriter, r *http.Request) {
	if p, err := u.who(r); err == nil {
		if !checkCSRF(r, p) {
			http.Error(w, "CSRF check failed", http.StatusForbidden)
			return
		}
	}
	u.clearSession(w)
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}
