package ui

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"kiln/api"
)

// Sessions are sealed cookies, not server-side records: the cookie holds
// the signed-in token, its expiry and the session's CSRF secret, sealed
// with AES-256-GCM under a key derived from the site key, so every node of
// the site opens it and no store command is needed (DESIGN.md "Sessions").

// CookieName is the session cookie.
const CookieName = "kiln-session"

// sessionInfo labels the key derivation (HMAC-SHA-256 of the site key).
const sessionInfo = "kiln api/ui session cookie v1"

// errNoSession is any cookie that does not open, or has expired.
var errNoSession = errors.New("no valid session")

// session is what the cookie seals.
type session struct {
	Token   string `json:"t"`
	Expires int64  `json:"e"` // unix seconds
	CSRF    string `json:"c"` // base64url, 32 random bytes
}

// principal is a signed-in request: its session and what the API says of its token.
type principal struct {
	session
	Name string
	Role api.Role
}

func (p principal) may(need api.Role) bool { return p.Role.Allows(need) }

// sessionKeys derives one AEAD per site key, primary first.
func sessionKeys(keys [][]byte) ([]cipher.AEAD, error) {
	if len(keys) == 0 {
		return nil, errors.New("ui: no site key")
	}
	out := make([]cipher.AEAD, 0, len(keys))
	for _, k := range keys {
		if len(k) < 16 {
			return nil, errors.New("ui: site key too short")
		}
		mac := hmac.New(sha256.New, k)
		mac.Write([]byte(sessionInfo))
		b, err := aes.NewCipher(mac.Sum(nil))
		if err != nil {
			return nil, err
		}
		g, err := cipher.NewGCM(b)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// seal returns the cookie value of s (sealed under the primary key).
func (u *UI) seal(s session) (string, error) {
	keys, err := sessionKeys(u.cfg.Keys())
	if err != nil {
		return "", err
	}
	js, err := json.Marshal(s)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, keys[0].NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	ct := keys[0].Seal(nonce, nonce, js, []byte(CookieName))
	return "v1." + base64.RawURLEncoding.EncodeToString(ct), nil
}

// open returns the session a cookie value seals, if any key of the ring
// opens it and it has not expired.
func (u *UI) open(v string) (session, error) {
	raw, ok := strings.CutPrefix(v, "v1.")
	if !ok {
		return session{}, errNoSession
	}
	ct, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil {
		return session{}, errNoSession
	}
	keys, err := sessionKeys(u.cfg.Keys())
	if err != nil {
		return session{}, err
	}
	for _, k := range keys {
		if len(ct) < k.NonceSize() {
			break
		}
		js, err := k.Open(nil, ct[:k.NonceSize()], ct[k.NonceSize():], []byte(CookieName))
		if err != nil {
			continue
		}
		var s session
		if err := json.Unmarshal(js, &s); err != nil || s.Token == "" || s.CSRF == "" {
			return session{}, errNoSession
		}
		if !u.cfg.Now().Before(time.Unix(s.Expires, 0)) {
			return session{}, errNoSession
		}
		return s, nil
	}
	return session{}, errNoSession
}

// who returns the request's principal: a session cookie that opens, whose
// token the API still knows (its role is the API's today, not the one at
// sign-in).
func (u *UI) who(r *http.Request) (principal, error) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return principal{}, errNoSession
	}
	s, err := u.open(c.Value)
	if err != nil {
		return principal{}, err
	}
	name, role, ok := u.cfg.API.Authenticate(s.Token)
	if !ok {
		return principal{}, errNoSession
	}
	return principal{session: s, Name: name, Role: role}, nil
}

// setSession writes the cookie: HTTP-only, SameSite=Strict, path /ui/,
// with the session's expiry; Secure over HTTPS.
func (u *UI) setSession(w http.ResponseWriter, s session) error {
	v, err := u.seal(s)
	if err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: v, Path: Prefix, Expires: time.Unix(s.Expires, 0),
		MaxAge: int(time.Until(time.Unix(s.Expires, 0)).Seconds()), HttpOnly: true, Secure: u.cfg.Secure,
		SameSite: http.SameSiteStrictMode})
	return nil
}

func (u *UI) clearSession(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		Secure: u.cfg.Secure, SameSite: http.SameSiteStrictMode})
}

func newCSRF() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// sameOrigin refuses a state-changing request from another origin: an
// Origin header (every browser sends it on a POST) must name this host;
// without one, Sec-Fetch-Site, when sent, must be same-origin.
func sameOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		ou, err := url.Parse(o)
		return err == nil && ou.Host == r.Host
	}
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" {
		return s == "same-origin" || s == "none"
	}
	return true
}

// checkCSRF is the guard of every action: same origin, and the form's
// csrf field equal to the session's secret (constant-time).
func checkCSRF(r *http.Request, p principal) bool {
	if !sameOrigin(r) {
		return false
	}
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(p.CSRF)) == 1
}
