package appliance

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"kiln/api"
	"kiln/store"
)

func uploadImage(t *testing.T, n *node, name string, body []byte) store.Image {
	t.Helper()
	img, err := n.app.life.UploadImage(context.Background(), store.Image{Name: name, Version: "1", Format: "raw"},
		bytes.NewReader(body), store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// waitFile waits until n's catalog holds name with digest want. The bound
// is generous (a copy takes well under a second here alone): `go test -race
// ./...` on 2 cores runs this beside every other package, and one CI run
// took over 15 s for the late joiner's second copy.
func waitFile(t *testing.T, n *node, name, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if f, ent, err := n.app.images.cat.Open(name); err == nil {
			f.Close()
			if ent.SHA256 == want {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("node %s: image file %s with sha256 %s did not arrive within 60 s", n.cfg.NodeID, name, want)
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestImageReplication, on a real cluster on loopback: an image uploaded to
// node A arrives on a node B that joined before (same digest, byte for
// byte); a node C that joins later refuses A's corrupted copy (verified
// before it counts; nothing kept), and catches up once a good copy is
// there; every node reports holding both images.
func TestImageReplication(t *testing.T) {
	defer func(d time.Duration) { imageSyncTestInterval = d }(imageSyncTestInterval)
	imageSyncTestInterval = 100 * time.Millisecond
	a := startNode(t, "img-a", nil)
	a.waitReady(t)
	b := startNode(t, "img-b", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a))
	b.waitReady(t)

	body1 := randomBytes(t, 3<<20+17)
	img1 := uploadImage(t, a, "disk-one.img", body1)
	sum := sha256.Sum256(body1)
	if img1.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("record sha256 %s, body %x", img1.SHA256, sum)
	}
	waitFile(t, b, "disk-one.img", img1.SHA256)
	got, err := os.ReadFile(filepath.Join(b.cfg.Boot.ImageDir, "disk-one.img"))
	if err != nil || !bytes.Equal(got, body1) {
		t.Fatalf("node b's copy differs from the upload (%d bytes, %v)", len(got), err)
	}

	// Without a site certificate the forward port serves no image.
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := anon.Get("https://" + a.cfg.Raft.ForwardAddr + "/peer/images/" + img1.ID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("image without a client certificate: HTTP %d, want 401", resp.StatusCode)
	}

	// A second image, whose only copy (on A and B) is then corrupted in
	// place with size and mtime kept, so A and B still believe their cached
	// digest and serve the bad bytes.
	body2 := randomBytes(t, 1<<20)
	img2 := uploadImage(t, a, "disk-two.img", body2)
	waitFile(t, b, "disk-two.img", img2.SHA256)
	bad := bytes.Clone(body2)
	bad[len(bad)/2] ^= 0xff
	corrupt := func(n *node, content []byte) {
		p := filepath.Join(n.cfg.Boot.ImageDir, "disk-two.img")
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	corrupt(a, bad)
	corrupt(b, bad)

	c := startNode(t, "img-c", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a))
	c.waitReady(t)
	waitFile(t, c, "disk-one.img", img1.SHA256) // the late joiner catches up
	deadline := time.Now().Add(15 * time.Second)
	for c.app.images.refused.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("node c refused %d corrupted copies, want ≥ 2 (from a and b)", c.app.images.refused.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(c.cfg.Boot.ImageDir, "disk-two.img")); !os.IsNotExist(err) {
		t.Fatalf("node c kept a file of a refused copy: %v", err)
	}
	// A good copy again on A: C takes it.
	corrupt(a, body2)
	waitFile(t, c, "disk-two.img", img2.SHA256)

	pres, err := c.app.images.ImagePresence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := pres[img1.ID]; len(got) != 3 {
		t.Fatalf("image 1 held on %v, want all three nodes", got)
	}
	// B's copy of image 2 is still corrupted (size and mtime kept, so its
	// catalog believes the old digest): it holds it by its own check, which
	// is why C re-checks every copy it takes.
	if got := pres[img2.ID]; len(got) < 2 {
		t.Fatalf("image 2 held on %v, want at least a and c", got)
	}

	// The site status shows it, on any node.
	req, _ := http.NewRequest("GET", "http://"+b.cfg.API.Addr+"/v1/site/status", nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ss api.SiteStatus
	if err := json.NewDecoder(resp.Body).Decode(&ss); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("site status: HTTP %d, %v", resp.StatusCode, err)
	}
	for _, iv := range ss.Images {
		if iv.ID == img1.ID && !slices.Equal(iv.Nodes, []string{"img-a", "img-b", "img-c"}) {
			t.Fatalf("site status: image 1 on %v, want all three nodes", iv.Nodes)
		}
	}
	if len(ss.Images) != 2 {
		t.Fatalf("site status lists %d images, want 2", len(ss.Images))
	}
}

// stopNode stops n's Run and waits for it (its test cleanup still finds
// the result).
func stopNode(t *testing.T, n *node) {
	t.Helper()
	n.cancel()
	select {
	case err := <-n.done:
		n.done <- err
		if err != nil {
			t.Fatalf("node %s: Run: %v", n.cfg.NodeID, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("node %s did not stop within 20 s", n.cfg.NodeID)
	}
}

// restartNode starts a new appliance on stopped node n's configuration and
// data directory.
func restartNode(t *testing.T, n *node) *node {
	t.Helper()
	app, err := New(n.cfg, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &node{cfg: n.cfg, app: app, cancel: cancel, done: make(chan error, 1), token: n.token}
	go func() { r.done <- app.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("node %s (restarted): Run: %v", n.cfg.NodeID, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("node %s (restarted) did not stop within 20 s", n.cfg.NodeID)
		}
	})
	return r
}

// waitNoFile waits until n's catalog has no file name.
func waitNoFile(t *testing.T, n *node, name string) {
	t.Helper()
	p := filepath.Join(n.cfg.Boot.ImageDir, name)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: image file %s still there 15 s after its delete committed", n.cfg.NodeID, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func apiDelete(t *testing.T, n *node, path string) int {
	t.Helper()
	req, _ := http.NewRequest("DELETE", "http://"+n.cfg.API.Addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+n.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestImageDeleteReplication, on a real three-node cluster on loopback: an
// image deleted through one node's API (a follower: the delete is
// forwarded) loses its file on every node once the delete commits; a node
// that was down at a delete removes the file when it comes back; a file
// there under a deleted image's name that is not the deleted content is
// left alone; the site status lists none of the deleted images and no
// node reports holding them.
func TestImageDeleteReplication(t *testing.T) {
	defer func(d time.Duration) { imageSyncTestInterval = d }(imageSyncTestInterval)
	imageSyncTestInterval = 100 * time.Millisecond
	a := startNode(t, "del-a", nil)
	a.waitReady(t)
	b := startNode(t, "del-b", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a))
	b.waitReady(t)
	c := startNode(t, "del-c", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a))
	c.waitReady(t)

	imgs := make([]store.Image, 4)
	for i := range imgs {
		imgs[i] = uploadImage(t, a, fmt.Sprintf("del-%d.img", i), randomBytes(t, 256<<10+i))
	}
	for _, n := range []*node{a, b, c} {
		for _, im := range imgs {
			waitFile(t, n, im.Name, im.SHA256)
		}
	}

	// Deleted through follower b's API: gone on all three.
	if st := apiDelete(t, b, "/v1/images/"+imgs[0].ID); st != http.StatusNoContent && st != http.StatusOK {
		t.Fatalf("DELETE image on b: HTTP %d", st)
	}
	for _, n := range []*node{a, b, c} {
		waitNoFile(t, n, imgs[0].Name)
	}

	// Node c down while images 1 and 2 are deleted; c's copy of image 2 is
	// then replaced by other bytes (someone's file under that name).
	stopNode(t, c)
	for _, im := range imgs[1:3] {
		if st := apiDelete(t, a, "/v1/images/"+im.ID); st != http.StatusNoContent && st != http.StatusOK {
			t.Fatalf("DELETE image %s on a: HTTP %d", im.ID, st)
		}
	}
	for _, n := range []*node{a, b} {
		waitNoFile(t, n, imgs[1].Name)
		waitNoFile(t, n, imgs[2].Name)
	}
	other := []byte("not the deleted image\n")
	otherPath := filepath.Join(c.cfg.Boot.ImageDir, imgs[2].Name)
	if err := os.WriteFile(otherPath, other, 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour) // older than the delete: only its content tells it apart
	if err := os.Chtimes(otherPath, old, old); err != nil {
		t.Fatal(err)
	}
	c = restartNode(t, c)
	c.waitReady(t)
	waitNoFile(t, c, imgs[1].Name)
	deadline := time.Now().Add(15 * time.Second)
	for c.app.images.removed.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the restarted node removed no file")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // several sync rounds
	if got, err := os.ReadFile(otherPath); err != nil || !bytes.Equal(got, other) {
		t.Fatalf("a file under a deleted name that is not the deleted content was touched: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(c.cfg.Boot.ImageDir, imgs[3].Name)); err != nil {
		t.Fatalf("the image not deleted lost its file on c: %v", err)
	}

	pres, err := a.app.images.ImagePresence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range imgs[:3] {
		if len(pres[im.ID]) != 0 {
			t.Fatalf("deleted image %s still reported on %v", im.ID, pres[im.ID])
		}
	}
	if got := pres[imgs[3].ID]; len(got) != 3 {
		t.Fatalf("the kept image is held on %v, want all three", got)
	}
	req, _ := http.NewRequest("GET", "http://"+c.cfg.API.Addr+"/v1/site/status", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ss api.SiteStatus
	if err := json.NewDecoder(resp.Body).Decode(&ss); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("site status: HTTP %d, %v", resp.StatusCode, err)
	}
	if len(ss.Images) != 1 || ss.Images[0].ID != imgs[3].ID {
		t.Fatalf("site status lists %+v, want only %s", ss.Images, imgs[3].ID)
	}
	tombs, err := c.app.Store.ImageTombstones()
	if err != nil || len(tombs) != 3 {
		t.Fatalf("%d tombstones on c, want 3: %v", len(tombs), err)
	}
}
