package appliance

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"kiln/api"
	"kiln/httpboot"
	"kiln/store"
)

// Backup archives (GET /v1/backup, `kiln backup`) and their offline
// restore (`kiln restore`). store/DESIGN.md "Backup, restore, recovery"
// is the runbook.
//
// An archive is an uncompressed POSIX tar with, in this order:
//
//	store/fsm.db     the store's state: one bbolt read transaction of fsm.db (store.Backup)
//	images/NAME      with images=true only: each image file a store record names, as stored
//	manifest.json    BackupManifest (last: an archive cut short has none and is refused)
//
// Images are referenced by name, size and SHA-256 unless included: they are
// large, immutable and identified by digest, so an operator who keeps them
// elsewhere (or another node that still has them) need not copy them into
// every backup. The in-RAM environment (vmlinuz, initramfs) is listed with
// its digests only: its build is reproducible, so restoring means building
// or copying it and comparing the digests.

// BackupFormat is BackupManifest.Format of the archives this binary writes
// and reads.
const BackupFormat = "kiln-backup/1"

// Archive member names.
const (
	backupStoreMember    = "store/fsm.db"
	backupImagesDir      = "images/"
	backupManifestMember = "manifest.json"
)

// BackupManifest is the archive's manifest.json.
type BackupManifest struct {
	Format  string      `json:"format"` // BackupFormat
	Created time.Time   `json:"created"`
	NodeID  string      `json:"node_id"` // the node the backup was taken on
	Version string      `json:"version"` // its binary version
	Store   BackupStore `json:"store"`
	// Images lists every image record of the store.
	Images []BackupImage `json:"images"`
	// Env lists the files of the node's in-RAM environment directory.
	Env []BackupFile `json:"env"`
}

// BackupStore describes store/fsm.db: the raft index it reflects, its
// size in bytes and SHA-256 (hex).
type BackupStore struct {
	Index  uint64 `json:"index"`
	Size   int64  `json:"size_bytes"`
	SHA256 string `json:"sha256"`
}

// BackupImage is one image record: ID, name (the catalog file name),
// version, format, and the size and SHA-256 of its content as the record
// holds them (for a compressed image: of the decompressed content).
// FileSize and FileSHA256 are those of the catalog file as stored on the
// node (zero when the node had no file of that name); Member is the
// archive member holding that file ("" when not included).
type BackupImage struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Version    string `json:"version,omitempty"`
	Format     string `json:"format,omitempty"`
	Size       uint64 `json:"size_bytes"`
	SHA256     string `json:"sha256"`
	FileSize   int64  `json:"file_size_bytes,omitempty"`
	FileSHA256 string `json:"file_sha256,omitempty"`
	Member     string `json:"member,omitempty"`
}

// BackupFile is one environment file: its path relative to the environment
// directory, size in bytes and SHA-256 (hex).
type BackupFile struct {
	Path   string `json:"path"`
	Size   int64  `json:"size_bytes"`
	SHA256 string `json:"sha256"`
}

// backupSource is what a backup reads on this node.
type backupSource struct {
	st      *store.Store
	catalog *httpboot.Catalog
	envDir  string
	version string
}

// Backup is api.BackupBackend.
func (b *apiBackend) Backup(ctx context.Context, w io.Writer, opt api.BackupOptions) error {
	if b.bk == nil {
		return fmt.Errorf("%w: this node was built without a backup source", api.ErrInvalid)
	}
	return b.bk.write(ctx, w, opt)
}

func (b *backupSource) write(ctx context.Context, w io.Writer, opt api.BackupOptions) error {
	man := BackupManifest{Format: BackupFormat, Created: time.Now().UTC(), NodeID: b.st.NodeID(), Version: b.version}
	env, err := hashDir(b.envDir)
	if err != nil {
		return fmt.Errorf("backup: environment %s: %w", b.envDir, err)
	}
	man.Env = env
	tw := tar.NewWriter(w)
	var imgs []store.Image
	err = b.st.Backup(ctx, func(info store.BackupInfo, snap io.WriterTo) error {
		// The image records are read while the snapshot's transaction is
		// open, after the barrier: they are at least as new as it.
		var err error
		if imgs, err = b.st.ListImages(); err != nil {
			return err
		}
		if err := tw.WriteHeader(member(backupStoreMember, info.Size)); err != nil {
			return err
		}
		h := sha256.New()
		n, err := snap.WriteTo(io.MultiWriter(tw, h))
		if err != nil {
			return err
		}
		man.Store = BackupStore{Index: info.Index, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}
		return nil
	})
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].ID < imgs[j].ID })
	included := map[string]bool{}
	for _, im := range imgs {
		bi := BackupImage{ID: im.ID, Name: im.Name, Version: im.Version, Format: im.Format, Size: im.Size, SHA256: im.SHA256}
		f, ent, err := b.catalog.Open(im.Name)
		switch {
		case errors.Is(err, httpboot.ErrNotFound), errors.Is(err, httpboot.ErrBadName):
		case err != nil:
			return fmt.Errorf("backup: image %s: %w", im.Name, err)
		default:
			bi.FileSize, bi.FileSHA256 = ent.Size, ent.SHA256
			if opt.Images && !included[im.Name] {
				err = copyMember(tw, backupImagesDir+im.Name, f, ent.Size, ent.SHA256)
				if err != nil {
					f.Close()
					return fmt.Errorf("backup: image %s: %w", im.Name, err)
				}
				included[im.Name] = true
			}
			f.Close()
			if included[im.Name] {
				bi.Member = backupImagesDir + im.Name
			}
		}
		man.Images = append(man.Images, bi)
	}
	raw, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(member(backupManifestMember, int64(len(raw)))); err != nil {
		return err
	}
	if _, err := tw.Write(raw); err != nil {
		return err
	}
	return tw.Close()
}

func member(name string, size int64) *tar.Header {
	return &tar.Header{Name: name, Mode: 0o600, Size: size, Typeflag: tar.TypeReg, ModTime: time.Now().UTC().Truncate(time.Second), Format: tar.FormatPAX}
}

// copyMember writes f (size bytes) as member name, checking its SHA-256.
func copyMember(tw *tar.Writer, name string, f io.Reader, size int64, want string) error {
	if err := tw.WriteHeader(member(name, size)); err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(tw, h), f, size); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("the file changed while it was read (SHA-256 %s, the catalog had %s)", got, want)
	}
	return nil
}

// hashDir lists the regular files under dir (sorted) with their SHA-256;
// a missing dir lists nothing.
func hashDir(dir string) ([]BackupFile, error) {
	var out []BackupFile
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == dir {
				return filepath.SkipDir
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, BackupFile{Path: filepath.ToSlash(rel), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))})
		return nil
	})
	return out, err
}

// RestoreOptions say where RestoreBackup builds the new node.
type RestoreOptions struct {
	// DataDir is the new node's data_dir; it must not exist or be empty.
	DataDir string
	// NodeID and RaftAddr are the new node's node_id and raft.addr (as in
	// its kiln.yaml): the restored state's raft configuration names them.
	NodeID, RaftAddr string
	// ImageDir receives the archive's image files (default DATA_DIR/images,
	// the default boot.image_dir); it must not hold files of those names.
	ImageDir string
	// SiteKeyFile, when set, is copied to DATA_DIR/site.key (the default
	// bmc.key_file): the site key the backed-up BMC credentials are sealed
	// under. Without it the new node makes a new site key and those
	// credentials cannot be opened until the old key file is put there.
	SiteKeyFile string
}

// RestoreReport is what RestoreBackup did.
type RestoreReport struct {
	Manifest BackupManifest
	Index    uint64   // raft index of the restored state
	Images   []string // image files restored into ImageDir
	Missing  []string // image records whose file the archive did not hold: name, file size and SHA-256
	SiteKey  bool     // the site key file was copied
}

// RestoreBackup builds, from the archive read from r, the data directory of
// a new one-node cluster that `kiln serve` (with this node_id, raft.addr
// and data_dir, and raft.bootstrap: true so that it makes its site
// certificate) opens with the backed-up state: DATA_DIR/store from
// store.RestoreDataDir, the included images in ImageDir, the site key if
// given. It is offline: no node may be running on DataDir. It refuses a
// non-empty DataDir, an archive of another format, one without a manifest
// (cut short) and any member whose size or SHA-256 differs from the
// manifest; on any error it removes what it created.
func RestoreBackup(r io.Reader, opt RestoreOptions) (rep RestoreReport, err error) {
	if opt.DataDir == "" {
		return rep, errors.New("restore: a data directory is required")
	}
	if ents, err := os.ReadDir(opt.DataDir); err == nil && len(ents) > 0 {
		return rep, fmt.Errorf("restore: %s is not empty (%s, ...): restore only into a fresh data directory; move it aside or name another", opt.DataDir, ents[0].Name())
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rep, fmt.Errorf("restore: %w", err)
	}
	if opt.ImageDir == "" {
		opt.ImageDir = filepath.Join(opt.DataDir, "images")
	}
	if err := os.MkdirAll(opt.DataDir, 0o700); err != nil {
		return rep, fmt.Errorf("restore: %w", err)
	}
	var created []string // image files placed in ImageDir
	defer func() {
		if err != nil {
			for _, p := range created {
				_ = os.Remove(p)
			}
			_ = os.RemoveAll(opt.DataDir)
		}
	}()
	stage := filepath.Join(opt.DataDir, ".restore")
	if err := os.MkdirAll(filepath.Join(stage, "images"), 0o700); err != nil {
		return rep, fmt.Errorf("restore: %w", err)
	}
	type got struct {
		size int64
		sum  string
	}
	members := map[string]got{}
	var man *BackupManifest
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return rep, fmt.Errorf("restore: reading the archive: %w", err)
		}
		if man != nil {
			return rep, fmt.Errorf("restore: member %q after the manifest: not an archive `kiln backup` wrote", h.Name)
		}
		var dst string
		switch {
		case h.Name == backupManifestMember:
			raw, err := io.ReadAll(io.LimitReader(tr, 64<<20))
			if err != nil {
				return rep, fmt.Errorf("restore: manifest: %w", err)
			}
			man = &BackupManifest{}
			if err := json.Unmarshal(raw, man); err != nil {
				return rep, fmt.Errorf("restore: manifest: %w", err)
			}
			continue
		case h.Name == backupStoreMember:
			dst = filepath.Join(stage, "fsm.db")
		case strings.HasPrefix(h.Name, backupImagesDir) && httpboot.ValidImageName(path.Base(h.Name)) && path.Dir(h.Name)+"/" == backupImagesDir:
			dst = filepath.Join(stage, "images", path.Base(h.Name))
		default:
			return rep, fmt.Errorf("restore: unexpected archive member %q: not an archive `kiln backup` wrote", h.Name)
		}
		if _, dup := members[h.Name]; dup || h.Typeflag != tar.TypeReg {
			return rep, fmt.Errorf("restore: archive member %q repeated or not a file", h.Name)
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return rep, fmt.Errorf("restore: %w", err)
		}
		hs := sha256.New()
		n, err := io.Copy(io.MultiWriter(f, hs), tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return rep, fmt.Errorf("restore: member %s: %w", h.Name, err)
		}
		members[h.Name] = got{size: n, sum: hex.EncodeToString(hs.Sum(nil))}
	}
	if man == nil {
		return rep, fmt.Errorf("restore: the archive has no %s: it was cut short (a backup that failed midway); take a new one", backupManifestMember)
	}
	if man.Format != BackupFormat {
		return rep, fmt.Errorf("restore: archive format %q; this binary reads %q", man.Format, BackupFormat)
	}
	rep.Manifest = *man
	sg, ok := members[backupStoreMember]
	if !ok || sg.size != man.Store.Size || sg.sum != man.Store.SHA256 {
		return rep, fmt.Errorf("restore: %s is missing or differs from the manifest (size %d, sha256 %s; manifest: %d, %s)",
			backupStoreMember, sg.size, sg.sum, man.Store.Size, man.Store.SHA256)
	}
	want := map[string]BackupImage{}
	for _, im := range man.Images {
		switch {
		case im.Member != "":
			want[im.Member] = im
		case im.FileSHA256 != "":
			rep.Missing = append(rep.Missing, fmt.Sprintf("%s (%d bytes, sha256:%s)", im.Name, im.FileSize, im.FileSHA256))
		default:
			rep.Missing = append(rep.Missing, im.Name+" (the backed-up node had no file for it either)")
		}
	}
	for name, g := range members {
		if name == backupStoreMember {
			continue
		}
		im, ok := want[name]
		if !ok || g.size != im.FileSize || g.sum != im.FileSHA256 {
			return rep, fmt.Errorf("restore: %s is not in the manifest or differs from it (size %d, sha256 %s)", name, g.size, g.sum)
		}
		delete(want, name)
	}
	for name := range want {
		return rep, fmt.Errorf("restore: the manifest lists %s but the archive does not hold it", name)
	}

	fsmFile, err := os.Open(filepath.Join(stage, "fsm.db"))
	if err != nil {
		return rep, fmt.Errorf("restore: %w", err)
	}
	rep.Index, err = store.RestoreDataDir(filepath.Join(opt.DataDir, "store"), opt.NodeID, opt.RaftAddr, fsmFile)
	fsmFile.Close()
	if err != nil {
		return rep, fmt.Errorf("restore: %w", err)
	}
	if err := os.MkdirAll(opt.ImageDir, 0o755); err != nil {
		return rep, fmt.Errorf("restore: image dir: %w", err)
	}
	for name := range members {
		if name == backupStoreMember {
			continue
		}
		base := path.Base(name)
		dst := filepath.Join(opt.ImageDir, base)
		if _, err := os.Lstat(dst); err == nil {
			return rep, fmt.Errorf("restore: %s already exists; restore into an image directory without it", dst)
		}
		if err := os.Rename(filepath.Join(stage, "images", base), dst); err != nil {
			return rep, fmt.Errorf("restore: image %s: %w", base, err)
		}
		created = append(created, dst)
		rep.Images = append(rep.Images, base)
	}
	sort.Strings(rep.Images)
	sort.Strings(rep.Missing)
	if opt.SiteKeyFile != "" {
		raw, err := os.ReadFile(opt.SiteKeyFile)
		if err != nil {
			return rep, fmt.Errorf("restore: site key: %w", err)
		}
		if err := os.WriteFile(filepath.Join(opt.DataDir, "site.key"), raw, 0o600); err != nil {
			return rep, fmt.Errorf("restore: site key: %w", err)
		}
		rep.SiteKey = true
	}
	if err := os.RemoveAll(stage); err != nil {
		return rep, fmt.Errorf("restore: %w", err)
	}
	return rep, nil
}

// RecoverServer is one surviving server given to RecoverCluster: node ID
// and raft address.
type RecoverServer struct{ ID, RaftAddr string }

// RecoverCluster is `kiln cluster recover`: store.RecoverCluster on the
// store directory of data directory dataDir (DATA_DIR/store) of the
// stopped node nodeID, rewriting the cluster's configuration to servers
// (the survivors, nodeID among them). It returns the raft index of the
// recovered state. store/DESIGN.md "Backup, restore, recovery" has the
// runbook.
func RecoverCluster(dataDir, nodeID string, servers []RecoverServer) (uint64, error) {
	sv := make([]store.RecoverServer, len(servers))
	for i, s := range servers {
		sv[i] = store.RecoverServer{ID: s.ID, RaftAddr: s.RaftAddr}
	}
	return store.RecoverCluster(filepath.Join(dataDir, "store"), nodeID, sv, nil)
}
