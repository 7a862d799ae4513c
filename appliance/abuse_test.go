package appliance

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tests of issue 20's break-it findings on the API, against the whole
// appliance (real store, lifecycle, catalog and both listeners on loopback),
// as `kiln serve` runs it with the embedded default configuration.

// rawExchange sends a request's headers with Content-Length: declared, then
// the first `send` bytes of body, then (with halfClose) ends its side of
// the connection, and reads the answer. It returns the status, the error
// code of the body, the time from the headers to the answer and whether the
// server closed the connection after it.
func rawExchange(t *testing.T, addr, method, path, token string, hdr []string, declared int, body string, halfClose bool) (int, string, time.Duration, bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: kiln\r\nContent-Length: %d\r\n", method, path, declared)
	if token != "" {
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	b.WriteString("\r\n")
	start := time.Now()
	if _, err := io.WriteString(c, b.String()+body); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s: no answer: %v", method, path, err)
	}
	took := time.Since(start)
	rb, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var eb struct{ Error struct{ Code string } }
	_ = json.Unmarshal(rb, &eb)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, rerr := br.ReadByte()
	return res.StatusCode, eb.Error.Code, took, rerr == io.EOF
}

// TestSlowBodiesBothListeners: on the API listener and on the boot listener
// (agent routes and httpboot's), a request whose body never comes is
// answered at once when refused, and cut at the configured body timeout
// when accepted; before, a body trickled one byte every 4 s held the
// connection 80 s on either port, invalid token or not.
func TestSlowBodiesBothListeners(t *testing.T) {
	const idle, jsonTotal = 700 * time.Millisecond, time.Second
	n := startNode(t, DefaultNodeID, nil, func(c *Config) {
		c.API.BodyIdleTimeout, c.API.JSONBodyTimeout = idle, jsonTotal
	})
	n.waitReady(t)
	api, boot := n.cfg.API.Addr, n.cfg.Boot.HTTPAddr
	const atOnce = 500 * time.Millisecond
	for _, c := range []struct {
		name, addr, method, path, token string
		hdr                             []string
		status                          int
		code                            string
		within                          time.Duration
	}{
		{"API, invalid token", api, "POST", "/v1/sites", "bogus", nil, 401, "unauthorized", atOnce},
		{"API, invalid token, upload", api, "POST", "/v1/images?name=x&version=1&sha256=" + strings.Repeat("a", 64), "bogus", nil, 401, "unauthorized", atOnce},
		{"API, admin, body never comes", api, "POST", "/v1/sites", n.token, nil, 408, "body_timeout", idle + atOnce},
		{"boot, agent route, invalid token", boot, "POST", "/v1/agent/report", "bogus", []string{"X-Kiln-Machine", "m-1"}, 403, "forbidden", atOnce},
		{"boot, agent route, no machine header", boot, "POST", "/v1/agent/register", "bogus", nil, 400, "invalid", atOnce},
		{"boot, iPXE script with a body", boot, "POST", "/ipxe/52:54:00:00:00:01", "", nil, 413, "", atOnce},
		{"boot, image with a body", boot, "GET", "/images/x", "", nil, 413, "", atOnce},
	} {
		status, code, took, closed := rawExchange(t, c.addr, c.method, c.path, c.token, c.hdr, 100, "", false)
		if status != c.status || code != c.code || took > c.within || !closed {
			t.Errorf("%s: %d %q after %v (closed %v), want %d %q within %v and closed",
				c.name, status, code, took, closed, c.status, c.code, c.within)
		}
	}
}

// TestCutOffUploadIsTheClientsError: an upload the client cuts off (it
// declared 1 MiB, sent 64 KiB and closed its side) is 400 body_incomplete,
// not 500 internal, and leaves nothing: no image record, no catalog file,
// no temporary file.
func TestCutOffUploadIsTheClientsError(t *testing.T) {
	n := startNode(t, DefaultNodeID, nil)
	n.waitReady(t)
	q := url.Values{"name": {"cut.raw"}, "version": {"1"}, "sha256": {strings.Repeat("a", 64)}}
	status, code, _, _ := rawExchange(t, n.cfg.API.Addr, "POST", "/v1/images?"+q.Encode(), n.token, nil,
		1<<20, strings.Repeat("x", 64<<10), true)
	if status != http.StatusBadRequest || code != "body_incomplete" {
		t.Fatalf("cut-off upload: %d %q, want 400 body_incomplete", status, code)
	}
	imgDir := n.cfg.Boot.ImageDir
	for _, dir := range []string{imgDir, filepath.Join(imgDir, ".tmp"), filepath.Join(imgDir, ".meta")} {
		des, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, de := range des {
			if !de.IsDir() {
				t.Errorf("left behind: %s", filepath.Join(dir, de.Name()))
			}
		}
	}
	code2, body := httpDo(t, n.token, "GET", "http://"+n.cfg.API.Addr+"/v1/images", "", nil)
	if code2 != 200 || !strings.Contains(string(body), `"items":[]`) {
		t.Fatalf("images after a cut-off upload: %d %s", code2, body)
	}
}

// apiCall sends a request to the API with the node's admin token; body is
// sent as is (string) and the answer's error code is decoded.
func apiCall(t *testing.T, n *node, method, path, ctype, body string) (int, string, []byte) {
	t.Helper()
	code, b := httpDo(t, n.token, method, "http://"+n.cfg.API.Addr+path, ctype, strings.NewReader(body))
	var eb struct{ Error struct{ Code string } }
	_ = json.Unmarshal(b, &eb)
	return code, eb.Error.Code, b
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestPutImageUnderChosenID: PUT /v1/images/{id} uploads under that ID (it
// used to ignore {id} and make a random one). Images are immutable content
// pinned by digest: the same upload again is 200 with the stored image, the
// body unread; other content under that ID is 409 and changes nothing; an ID
// that breaks the ID rule is 400.
func TestPutImageUnderChosenID(t *testing.T) {
	n := startNode(t, DefaultNodeID, nil)
	n.waitReady(t)
	data := strings.Repeat("ubuntu 24.04 disk ", 1000)
	q := url.Values{"name": {"ubuntu-24.04.raw"}, "version": {"24.04"}, "sha256": {sha(data)}}
	code, _, body := apiCall(t, n, "PUT", "/v1/images/ubuntu-2404?"+q.Encode(), "application/octet-stream", data)
	var im struct {
		ID     string `json:"id"`
		SHA256 string `json:"sha256"`
		RV     uint64 `json:"resource_version"`
	}
	if err := json.Unmarshal(body, &im); err != nil || code != http.StatusCreated || im.ID != "ubuntu-2404" || im.SHA256 != sha(data) {
		t.Fatalf("PUT new: %d %s", code, body)
	}
	if code, _, body := apiCall(t, n, "GET", "/v1/images/ubuntu-2404", "", ""); code != 200 || !strings.Contains(string(body), sha(data)) {
		t.Fatalf("GET by the chosen ID: %d %s", code, body)
	}
	// The same again: 200, the same record (not rewritten), and the body is
	// not needed — a declared 1 GiB that never comes is answered at once.
	code, _, body = apiCall(t, n, "PUT", "/v1/images/ubuntu-2404?"+q.Encode(), "application/octet-stream", data)
	var again struct {
		ID string `json:"id"`
		RV uint64 `json:"resource_version"`
	}
	_ = json.Unmarshal(body, &again)
	if code != http.StatusOK || again.ID != im.ID || again.RV != im.RV {
		t.Fatalf("PUT same again: %d %s", code, body)
	}
	status, _, took, _ := rawExchange(t, n.cfg.API.Addr, "PUT", "/v1/images/ubuntu-2404?"+q.Encode(), n.token, nil, 1<<30, "", false)
	if status != http.StatusOK || took > 2*time.Second {
		t.Fatalf("PUT same, body never sent: %d after %v", status, took)
	}
	// Other content, or other metadata, under the same ID: 409.
	other := strings.Repeat("something else ", 500)
	for _, oq := range []url.Values{
		{"name": {"ubuntu-24.04.raw"}, "version": {"24.04"}, "sha256": {sha(other)}},
		{"name": {"ubuntu-24.04.raw"}, "version": {"24.04.1"}, "sha256": {sha(data)}},
		{"name": {"other.raw"}, "version": {"24.04"}, "sha256": {sha(data)}},
	} {
		body := data
		if oq.Get("sha256") == sha(other) {
			body = other
		}
		if code, ec, b := apiCall(t, n, "PUT", "/v1/images/ubuntu-2404?"+oq.Encode(), "application/octet-stream", body); code != http.StatusConflict || ec != "conflict" {
			t.Fatalf("PUT other %v: %d %s", oq, code, b)
		}
	}
	if code, _, body := apiCall(t, n, "GET", "/v1/images/ubuntu-2404", "", ""); code != 200 || !strings.Contains(string(body), sha(data)) || !strings.Contains(string(body), `"version":"24.04"`) {
		t.Fatalf("after conflicts: %d %s", code, body)
	}
	// The ID rule.
	if code, ec, b := apiCall(t, n, "PUT", "/v1/images/-bad?"+q.Encode(), "application/octet-stream", data); code != 400 || ec != "invalid" || !strings.Contains(string(b), `"field":"id"`) {
		t.Fatalf("bad id: %d %s", code, b)
	}
	// A second ID for a name already stored is a conflict too (names are unique).
	if code, _, b := apiCall(t, n, "PUT", "/v1/images/ubuntu-copy?"+q.Encode(), "application/octet-stream", data); code != 409 {
		t.Fatalf("same name, new ID: %d %s", code, b)
	}
	code, _, body = apiCall(t, n, "GET", "/v1/images", "", "")
	if code != 200 || strings.Count(string(body), `"id":`) != 1 {
		t.Fatalf("images: %d %s", code, body)
	}
}

func gz(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestUploadChecksContentAndSize: an upload's body must decode in its
// declared format to exactly the declared size and sha256, and the size
// must be sane; otherwise 400 and nothing is kept (issue 20: a gzip upload
// of bytes that were not gzip, and size=18446744073709551615, were
// accepted and failed only when an agent wrote the image).
func TestUploadChecksContentAndSize(t *testing.T) {
	n := startNode(t, DefaultNodeID, nil)
	n.waitReady(t)
	raw := strings.Repeat("disk block ", 10000)
	good := gz(t, raw)
	for _, c := range []struct {
		name, format, size, sha256, body, code string
	}{
		{"notgz", "gzip", "23", sha("this is not gzip at all"), "this is not gzip at all", "format_mismatch"},
		{"notzst", "zstd", "23", sha("this is not zstd at all"), "this is not zstd at all", "format_mismatch"},
		{"truncgz", "gzip", fmt.Sprint(len(raw)), sha(raw), good[:len(good)/2], "format_mismatch"},
		{"trailgz", "gzip", fmt.Sprint(len(raw)), sha(raw), good + "trailing junk", "format_mismatch"},
		{"shortsize", "gzip", fmt.Sprint(len(raw) - 1), sha(raw), good, "size_mismatch"},
		{"longsize", "gzip", fmt.Sprint(len(raw) + 1), sha(raw), good, "size_mismatch"},
		{"wrongsha", "gzip", fmt.Sprint(len(raw)), sha("other"), good, "digest_mismatch"},
		{"hugegz", "gzip", "18446744073709551615", sha(raw), good, "invalid"},
		{"hugeraw", "raw", "18446744073709551615", sha(raw), raw, "invalid"},
		{"overmax", "raw", fmt.Sprint(uint64(1<<44) + 1), sha(raw), raw, "invalid"},
		{"rawsize", "raw", fmt.Sprint(len(raw) + 1), sha(raw), raw, "size_mismatch"},
		{"rawsha", "raw", "", sha("other"), raw, "digest_mismatch"},
	} {
		q := url.Values{"name": {c.name}, "version": {"1"}, "format": {c.format}, "sha256": {c.sha256}}
		if c.size != "" {
			q.Set("size", c.size)
		}
		code, ec, b := apiCall(t, n, "POST", "/v1/images?"+q.Encode(), "application/octet-stream", c.body)
		if code != http.StatusBadRequest || ec != c.code {
			t.Errorf("%s: %d %s, want 400 %s", c.name, code, b, c.code)
		}
	}
	imgDir := n.cfg.Boot.ImageDir
	for _, dir := range []string{imgDir, filepath.Join(imgDir, ".tmp")} {
		des, _ := os.ReadDir(dir)
		for _, de := range des {
			if !de.IsDir() {
				t.Errorf("a refused upload left %s", filepath.Join(dir, de.Name()))
			}
		}
	}
	if code, _, b := apiCall(t, n, "GET", "/v1/images", "", ""); code != 200 || !strings.Contains(string(b), `"items":[]`) {
		t.Fatalf("refused uploads recorded: %s", b)
	}
	// The right declaration of the same body is accepted, and the stored
	// bytes are the compressed ones the agent decodes.
	q := url.Values{"name": {"ok.raw"}, "version": {"1"}, "format": {"gzip"}, "sha256": {sha(raw)}, "size": {fmt.Sprint(len(raw))}}
	if code, _, b := apiCall(t, n, "POST", "/v1/images?"+q.Encode(), "application/octet-stream", good); code != 201 {
		t.Fatalf("good gzip: %d %s", code, b)
	}
	if got, err := os.ReadFile(filepath.Join(imgDir, "ok.raw")); err != nil || string(got) != good {
		t.Fatalf("stored %d bytes, %v", len(got), err)
	}
}

// TestMachineNamesSameRuleAsImport: the names and free text that import
// refuses, POST /v1/machines refuses too, naming the field; before, the API
// stored NUL, ESC, U+202E, newlines and a 100 KB name that import refused.
func TestMachineNamesSameRuleAsImport(t *testing.T) {
	n := startNode(t, DefaultNodeID, nil)
	n.waitReady(t)
	for i, name := range []string{"a\x00b", "esc\x1b[31mred", "rtl\u202eevil", "two\nlines", strings.Repeat("x", 100<<10)} {
		mac := fmt.Sprintf("52:54:00:00:20:%02x", i)
		js, _ := json.Marshal(map[string]any{"name": name, "intended": map[string]any{"nics": []map[string]string{{"mac": mac}}}})
		code, ec, b := apiCall(t, n, "POST", "/v1/machines", "application/json", string(js))
		if code != 400 || ec != "invalid" || !strings.Contains(string(b), `"field":"name"`) {
			t.Errorf("API, name %.20q: %d %.200s", name, code, b)
		}
		imp, _ := json.Marshal([]map[string]any{{"name": name, "macs": []string{mac}}})
		code, ec, b = apiCall(t, n, "POST", "/v1/machines/import?format=json", "application/json", string(imp))
		if code != 400 || ec != "import_rejected" || !strings.Contains(string(b), `"field":"name"`) {
			t.Errorf("import, name %.20q: %d %.200s", name, code, b)
		}
	}
	// A name both accept.
	js := `{"name":"rack3-u12","rack":"Zürich hall 3","intended":{"nics":[{"mac":"52:54:00:00:20:ff"}]}}`
	if code, _, b := apiCall(t, n, "POST", "/v1/machines", "application/json", js); code != 201 {
		t.Fatalf("good name: %d %s", code, b)
	}
	code, _, b := apiCall(t, n, "GET", "/v1/machines", "", "")
	if code != 200 || strings.Count(string(b), `"id":`) != 1 {
		t.Fatalf("machines: %s", b)
	}
}
