package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kiln/appliance/lifecycle"
	"kiln/httpboot"
	"kiln/store"
)

// Image replication (issue 12 item 3): every node holds every recorded
// image's file, so an agent fetches its image from the node that served its
// boot (the image URL is that node's boot HTTP listener).
//
// The record (store.Image) is replicated by raft; the file is not. Each node
// runs an imageSync: on start and every imageSyncInterval it lists the
// records and, for each whose file here is missing or is not the recorded
// content, asks the other members for it, one after another, until one
// copy passes. Transport: the forward RPC's HTTPS (store.PeerGet, route
// GET /peer/images/{id}), because it is already mutual TLS with the site
// certificates: only a member of this site can fetch an image and a node
// takes bytes only from a member, with no new listener, port or setting
// (the boot HTTP listener is plain HTTP on the provisioning network, open
// to any machine there, and its peers' addresses are not recorded).
//
// Verification: the bytes are written by lifecycle.PutImageFile, which
// checks the whole file against the record (raw: size and SHA-256 of the
// file; gzip/zstd: size and SHA-256 of the decoded content) before the
// catalog renames it into place; a copy that fails is removed, logged and
// counted (imageSync.refused), and the next member is asked. A peer's
// word (its own digest) counts for nothing.
//
// Deletes: a delete commits CmdDeleteImageV3, which leaves a tombstone (the
// deleted record and the leader's time, store.ImageTombstone). Every round,
// each node removes its catalog file named by a tombstone when no current
// record names that file, the file is not newer than the delete (a file
// written after it is a new upload under the name), and the file is the
// deleted content (checked as for presence): a different file that happens
// to carry the name is not ours to remove. ("Newer" allows tombstoneSkew,
// 2 min, for clocks that differ between nodes.) A node that was down at the
// delete does it when it comes back. Tombstones are kept (one small record
// per delete).
//
// Releases (issue 15): every layer of a release manifest other than its
// base is an image record of its own (store.Layer.Image), so its file is
// replicated, checked and removed by exactly the rules above, and a build
// of the release waits on a node until that node holds every layer's file
// (lifecycle imageHere).
//
// Presence: a node holds an image when its catalog file is the recorded
// content (checked as above; raw files by the catalog's cached digest). It
// answers GET /peer/images with the IDs it holds, and ImagePresence asks
// every member, so status can show which node holds which image.

// imageSyncInterval is how often a node compares its catalog with the image
// records.
const imageSyncInterval = 5 * time.Second

// imageSyncTestInterval, when not 0, replaces imageSyncInterval (tests).
var imageSyncTestInterval time.Duration

type imageSync struct {
	st       *store.Store
	cat      *httpboot.Catalog
	life     *lifecycle.Controller
	self     string
	interval time.Duration
	log      *slog.Logger
	// refused and pulled count the copies refused (not the recorded
	// content) and taken. Not yet exported as metrics (they would need
	// README.md's metrics table rows).
	refused atomic.Int64
	pulled  atomic.Int64

	// removed counts catalog files removed for tombstones.
	removed atomic.Int64

	mu sync.Mutex
	// gone: tombstones (image ID) whose file is known absent here, so a
	// round does not look again.
	gone map[string]bool
	// held: image ID → the catalog file (size, mtime, file digest) that was
	// found to be the recorded content; a compressed file is decoded once
	// per change of the file, not every round.
	held map[string]httpboot.Entry
}

func newImageSync(st *store.Store, cat *httpboot.Catalog, life *lifecycle.Controller, self string,
	log *slog.Logger) *imageSync {
	s := &imageSync{st: st, cat: cat, life: life, self: self, interval: imageSyncInterval,
		log: log.With("component", "imagesync"), held: map[string]httpboot.Entry{}, gone: map[string]bool{}}
	if imageSyncTestInterval != 0 {
		s.interval = imageSyncTestInterval
	}
	return s
}

// Run syncs at once (a node that joins late, or restarts, catches up) and
// then every interval until ctx ends. It returns nil.
func (s *imageSync) Run(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.syncOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// syncOnce brings every recorded image's file here, logging what it could
// not get (the next round tries again).
func (s *imageSync) syncOnce(ctx context.Context) {
	imgs, err := s.st.ListImages()
	if err != nil {
		s.log.Warn("listing images", "err", err)
		return
	}
	for _, img := range imgs {
		if ctx.Err() != nil {
			return
		}
		if img.SHA256 == "" || img.Size == 0 || !httpboot.ValidImageName(img.Name) || s.holds(img) {
			continue
		}
		if err := s.pull(ctx, img); err != nil && ctx.Err() == nil {
			s.log.Warn("image not here yet", "image", img.ID, "name", img.Name, "err", err)
		}
	}
	s.mu.Lock()
	for id := range s.held {
		if !hasImage(imgs, id) {
			delete(s.held, id)
		}
	}
	s.mu.Unlock()
	s.removeDeleted(imgs)
}

// tombstoneSkew is how much later than a delete (the leader's clock) a
// file's mtime (this node's clock) may be and still count as older than
// the delete: node clocks differ.
const tombstoneSkew = 2 * time.Minute

// removeDeleted removes the catalog file of each tombstone whose file here
// is the deleted content, unless a current record (imgs) names that file or
// the file is newer than the delete.
func (s *imageSync) removeDeleted(imgs []store.Image) {
	tombs, err := s.st.ImageTombstones()
	if err != nil {
		s.log.Warn("listing image tombstones", "err", err)
		return
	}
	for _, ts := range tombs {
		img := ts.Image
		s.mu.Lock()
		done := s.gone[img.ID]
		s.mu.Unlock()
		if done || !httpboot.ValidImageName(img.Name) || namedBy(imgs, img.Name) {
			continue
		}
		f, ent, err := s.cat.Open(img.Name)
		if err != nil {
			s.markGone(img.ID)
			continue
		}
		same := false
		if ent.ModTime.After(ts.DeletedAt.Add(tombstoneSkew)) {
			// Written after the delete: a new upload under this name, whose
			// record may be about to commit.
		} else if img.Format == "" || img.Format == "raw" {
			same = strings.EqualFold(ent.SHA256, img.SHA256) && uint64(ent.Size) == img.Size
		} else {
			same = lifecycle.CheckImageContent(img, f) == nil
		}
		f.Close()
		if !same {
			s.markGone(img.ID) // another file under the name: leave it, do not look again
			continue
		}
		if err := s.cat.Delete(img.Name); err != nil && !errors.Is(err, httpboot.ErrNotFound) {
			s.log.Warn("removing the file of a deleted image", "image", img.ID, "name", img.Name, "err", err)
			continue
		}
		s.removed.Add(1)
		s.markGone(img.ID)
		s.log.Info("image file removed: its record was deleted", "image", img.ID, "name", img.Name,
			"deleted_at", ts.DeletedAt)
	}
}

func (s *imageSync) markGone(id string) {
	s.mu.Lock()
	s.gone[id] = true
	s.mu.Unlock()
}

// namedBy reports whether a record of imgs names catalog file name.
func namedBy(imgs []store.Image, name string) bool {
	for _, im := range imgs {
		if im.Name == name {
			return true
		}
	}
	return false
}

func hasImage(imgs []store.Image, id string) bool {
	for _, im := range imgs {
		if im.ID == id {
			return true
		}
	}
	return false
}

// holds reports whether the catalog file of img here is img's recorded
// content, remembering a positive answer for the file as it is.
func (s *imageSync) holds(img store.Image) bool {
	f, ent, err := s.cat.Open(img.Name)
	if err != nil {
		s.forget(img.ID)
		return false
	}
	defer f.Close()
	s.mu.Lock()
	prev, ok := s.held[img.ID]
	s.mu.Unlock()
	if ok && prev.SHA256 == ent.SHA256 && prev.Size == ent.Size && prev.ModTime.Equal(ent.ModTime) {
		return true
	}
	var good bool
	if img.Format == "" || img.Format == "raw" {
		good = strings.EqualFold(ent.SHA256, img.SHA256) && uint64(ent.Size) == img.Size
	} else {
		good = lifecycle.CheckImageContent(img, f) == nil
	}
	if !good {
		s.forget(img.ID)
		return false
	}
	s.mu.Lock()
	s.held[img.ID] = ent
	s.mu.Unlock()
	return true
}

func (s *imageSync) forget(id string) {
	s.mu.Lock()
	delete(s.held, id)
	s.mu.Unlock()
}

// pull asks each other registered node for img's file until one copy passes
// lifecycle.PutImageFile's check. The error joins every member's failure.
func (s *imageSync) pull(ctx context.Context, img store.Image) error {
	nodes, err := s.st.NodeIDs()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nodes {
		if n == s.self {
			continue
		}
		err := s.pullFrom(ctx, n, img)
		if err == nil {
			s.pulled.Add(1)
			s.log.Info("image copied from a peer and verified", "image", img.ID, "name", img.Name, "from", n)
			return nil
		}
		errs = append(errs, fmt.Errorf("from %s: %w", n, err))
	}
	if len(errs) == 0 {
		return errors.New("no other member to copy it from: upload it to this node")
	}
	return errors.Join(errs...)
}

// pullTimeout bounds one copy of a size-byte image: a minute plus the time
// at pullMinBytesPerSec, so a stalled peer does not hold the replicator.
func pullTimeout(size uint64) time.Duration {
	return time.Minute + time.Duration(size/pullMinBytesPerSec)*time.Second
}

// pullMinBytesPerSec is the slowest copy rate pullTimeout allows (10 MiB/s).
const pullMinBytesPerSec = 10 << 20

func (s *imageSync) pullFrom(ctx context.Context, node string, img store.Image) error {
	ctx, cancel := context.WithTimeout(ctx, pullTimeout(img.Size))
	defer cancel()
	resp, err := s.st.PeerGet(ctx, node, "images/"+url.PathEscape(img.ID))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if _, err := s.life.PutImageFile(ctx, img, resp.Body); err != nil {
		if ctx.Err() == nil && isContentRefusal(err) {
			s.refused.Add(1)
			s.log.Warn("refused a peer's copy of an image: not the recorded content", "image", img.ID,
				"name", img.Name, "from", node, "err", err)
		}
		return err
	}
	return nil
}

// isContentRefusal: the copy arrived whole and was not the recorded content.
func isContentRefusal(err error) bool {
	for _, e := range []error{httpboot.ErrDigestMismatch, httpboot.ErrSizeMismatch,
		lifecycle.ErrDigest, lifecycle.ErrImageSize, lifecycle.ErrImageFormat} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Held returns the IDs of the images whose file here is the recorded
// content, sorted (as of the last sync round).
func (s *imageSync) Held() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.held))
	for id := range s.held {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// peerHandler serves other members (store.Config.PeerFiles, behind the
// forward RPC's client-certificate check):
//
//	GET /peer/images        → JSON {"node": id, "images": [image IDs held here]}
//	GET /peer/images/{id}   → the catalog file of image id (404 when not held here)
//
// It serves a file only when it is held (holds): a node never hands on a
// file it has not checked itself (the receiver checks again).
func (s *imageSync) peerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /peer/images", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(peerImages{Node: s.self, Images: s.Held()})
	})
	mux.HandleFunc("GET /peer/images/{id}", func(w http.ResponseWriter, r *http.Request) {
		img, err := s.st.GetImage(r.PathValue("id"))
		if err != nil {
			http.Error(w, "no such image record here", http.StatusNotFound)
			return
		}
		if !s.holds(img) {
			http.Error(w, "image file not held on "+s.self, http.StatusNotFound)
			return
		}
		f, ent, err := s.cat.Open(img.Name)
		if err != nil {
			http.Error(w, "image file not held on "+s.self, http.StatusNotFound)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(ent.Size, 10))
		_, _ = io.Copy(w, f)
	})
	return mux
}

type peerImages struct {
	Node   string   `json:"node"`
	Images []string `json:"images"`
}

// ImagePresence asks every registered node (this one from memory) which
// images it holds: image ID → sorted node IDs. A node that does not answer
// within ctx is left out and named in the error (the map is still filled).
func (s *imageSync) ImagePresence(ctx context.Context) (map[string][]string, error) {
	nodes, err := s.st.NodeIDs()
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	var errs []error
	for _, n := range nodes {
		var held []string
		if n == s.self {
			held = s.Held()
		} else {
			held, err = s.peerHeld(ctx, n)
			if err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n, err))
				continue
			}
		}
		for _, id := range held {
			out[id] = append(out[id], n)
		}
	}
	for id := range out {
		sort.Strings(out[id])
	}
	return out, errors.Join(errs...)
}

func (s *imageSync) peerHeld(ctx context.Context, node string) ([]string, error) {
	resp, err := s.st.PeerGet(ctx, node, "images")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d (a node older than image replication answers 404)", resp.StatusCode)
	}
	var pi peerImages
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&pi); err != nil {
		return nil, err
	}
	return pi.Images, nil
}
