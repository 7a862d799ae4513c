package appliance

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"kiln/deploy/lab/testkit"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// freeAddrs is testkit.FreeAddrs (ports below the ephemeral range).
func freeAddrs(t *testing.T, n int) []string { t.Helper(); return testkit.FreeAddrs(t, n) }

// running is an in-process appliance on loopback (embedded default, no
// provisioning interface) with its API URL, boot URL and admin token.
type running struct {
	api, boot, token string
	dataDir          string
}

func startAppliance(t *testing.T) running {
	t.Helper()
	n := startNode(t, DefaultNodeID, nil)
	n.waitReady(t)
	return running{api: "http://" + n.cfg.API.Addr, boot: "http://" + n.cfg.Boot.HTTPAddr,
		dataDir: n.cfg.DataDir, token: n.token}
}

func (r running) do(t *testing.T, method, u string, body io.Reader) (int, []byte) {
	t.Helper()
	return httpDo(t, r.token, method, u, "application/octet-stream", body)
}

// httpDo sends one request with a bearer token and returns status and body.
// expectClient is the tests' HTTP client: the default transport, honouring
// Expect: 100-continue.
var expectClient = func() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ExpectContinueTimeout = 5 * time.Second
	return &http.Client{Transport: tr}
}()

func httpDo(t *testing.T, token, method, u, ctype string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", ctype)
	if body != nil {
		// A refused body is not waited for (the server answers and closes):
		// with 100-continue the client sends the body only once the server
		// asks for it, as curl does for uploads, instead of writing into a
		// closed connection.
		req.Header.Set("Expect", "100-continue")
	}
	resp, err := expectClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// An image upload whose body does not match the declared SHA-256 is the
// client's error (400 digest_mismatch), not a 500; nothing is recorded and
// no file is left in the catalog.
func TestImageUploadWrongDigestIsClientError(t *testing.T) {
	r := startAppliance(t)
	data := []byte(strings.Repeat("kiln image bytes\n", 1000))
	good := sha256.Sum256(data)
	wrong := sha256.Sum256([]byte("something else"))
	up := func(name, sum string) (int, []byte) {
		q := url.Values{"name": {name}, "version": {"1"}, "sha256": {sum}}
		return r.do(t, http.MethodPost, r.api+"/v1/images?"+q.Encode(), strings.NewReader(string(data)))
	}
	code, body := up("wrongsum", hex.EncodeToString(wrong[:]))
	var eb struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if code != http.StatusBadRequest || eb.Error.Code != "digest_mismatch" {
		t.Fatalf("wrong sha256: got %d %s, want 400 digest_mismatch", code, body)
	}
	if _, err := os.Stat(filepath.Join(r.dataDir, "images", "wrongsum")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a rejected upload left a file in the catalog: %v", err)
	}
	code, body = r.do(t, http.MethodGet, r.api+"/v1/images", nil)
	if code != http.StatusOK || strings.Contains(string(body), "wrongsum") {
		t.Fatalf("a rejected upload was recorded: %d %s", code, body)
	}
	// The same body with the right digest is accepted.
	if code, body := up("rightsum", hex.EncodeToString(good[:])); code != http.StatusCreated {
		t.Fatalf("good upload: %d %s", code, body)
	}
}

// A zstd image is declared by its decompressed content (sha256 and size, the
// bytes the agent writes and verifies). The API used to have no way to pass
// size and the catalog insisted on the compressed bytes' digest, so no gzip
// or zstd image could be uploaded at all.
func TestCompressedImageUpload(t *testing.T) {
	r := startAppliance(t)
	raw := []byte(strings.Repeat("raw disk content ", 4096))
	var zbuf strings.Builder
	zw, err := zstd.NewWriter(&zbuf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	q := url.Values{"name": {"os.raw"}, "version": {"1"}, "format": {"zstd"}, "sha256": {hex.EncodeToString(sum[:])}}
	code, body := r.do(t, http.MethodPost, r.api+"/v1/images?"+q.Encode(), strings.NewReader(zbuf.String()))
	if code != http.StatusBadRequest || !strings.Contains(string(body), `"field":"size"`) {
		t.Fatalf("zstd without size: %d %s, want 400 naming size", code, body)
	}
	q.Set("size", strconv.Itoa(len(raw)))
	code, body = r.do(t, http.MethodPost, r.api+"/v1/images?"+q.Encode(), strings.NewReader(zbuf.String()))
	if code != http.StatusCreated {
		t.Fatalf("zstd upload: %d %s", code, body)
	}
	var im struct {
		SHA256 string `json:"sha256"`
		Size   int    `json:"size_bytes"`
		Format string `json:"format"`
	}
	if err := json.Unmarshal(body, &im); err != nil {
		t.Fatal(err)
	}
	if im.SHA256 != hex.EncodeToString(sum[:]) || im.Size != len(raw) || im.Format != "zstd" {
		t.Fatalf("recorded %+v, want the raw content's sha256 and size", im)
	}
	// The boot listener serves the stored (compressed) bytes.
	resp, err := http.Get(r.boot + "/images/os.raw")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(got) != zbuf.String() {
		t.Fatalf("GET /images/os.raw: %d, %d bytes", resp.StatusCode, len(got))
	}
}
