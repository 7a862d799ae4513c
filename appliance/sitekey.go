package appliance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"kiln/api"
	"kiln/bmc"
	"kiln/store"
)

// Names of the site secrets members hand each other (store.Config.JoinSecrets
// at enrollment, store.PushSecrets during a rotation).
const (
	secretKeyring  = "site_keyring"   // enrollment: the whole keyring, primary first
	secretKeyStage = "site_key_stage" // rotation 1: add a key that opens but does not seal yet
	secretKeyUse   = "site_key_use"   // rotation 2: make that key the primary (seals)
	secretKeyDrop  = "site_key_drop"  // rotation 4: drop these keys (never the primary)
)

// siteKeys is this node's site keyring (bmc.key_file) and the Sealer over
// it. A rotation (rotate) goes in four steps so that at every moment every
// node opens every stored credential: (1) the new key is staged on every
// member (it opens, the old one still seals); only once all have it (2) it
// becomes the primary everywhere; (3) every credential not sealed under it
// is opened and re-sealed under it, until none is left; (4) the old keys are
// dropped. A member that cannot be reached stops the rotation at the step
// it is in, and the message says which; nothing becomes unopenable.
type siteKeys struct {
	path   string
	sealer *bmc.Sealer
	log    *slog.Logger
	st     *store.Store // set once the store is open

	mu    sync.Mutex // guards keys and the file
	keys  [][]byte   // primary first
	rotMu sync.Mutex // one rotation at a time on this node
}

func newSiteKeys(path string, keys [][]byte, log *slog.Logger) (*siteKeys, error) {
	s, err := bmc.NewSealer(keys...)
	if err != nil {
		return nil, fmt.Errorf("site key %s: %w", path, err)
	}
	return &siteKeys{path: path, sealer: s, keys: keys, log: log.With("component", "site_key")}, nil
}

// keyring returns a copy of the site keys, primary first (the web UI
// derives its session cookie key from them, api/ui).
func (k *siteKeys) keyring() [][]byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([][]byte, len(k.keys))
	for i, key := range k.keys {
		out[i] = append([]byte(nil), key...)
	}
	return out
}

// joinSecrets is what a node admitted to the cluster receives.
func (k *siteKeys) joinSecrets() (map[string][]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return map[string][]byte{secretKeyring: bmc.JoinKeyring(k.keys)}, nil
}

// update applies one rotation step pushed by a member (or by this node).
func (k *siteKeys) update(secrets map[string][]byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	keys := append([][]byte(nil), k.keys...)
	has := func(key []byte) int {
		for i, x := range keys {
			if bytes.Equal(x, key) {
				return i
			}
		}
		return -1
	}
	switch {
	case secrets[secretKeyStage] != nil:
		key := secrets[secretKeyStage]
		if len(key) != bmc.KeySize {
			return fmt.Errorf("%w: staged site key is %d bytes", store.ErrInvalid, len(key))
		}
		if has(key) < 0 {
			keys = append(keys, key)
		}
	case secrets[secretKeyUse] != nil:
		key := secrets[secretKeyUse]
		i := has(key)
		if i < 0 {
			return fmt.Errorf("%w: site key %s was not staged on this node first", store.ErrInvalid, bmc.KeyID(key))
		}
		keys = append([][]byte{key}, append(keys[:i:i], keys[i+1:]...)...)
	case secrets[secretKeyDrop] != nil:
		drop, err := bmc.SplitKeyring(secrets[secretKeyDrop])
		if err != nil {
			return err
		}
		var kept [][]byte
		for i, x := range keys {
			gone := false
			for _, d := range drop {
				gone = gone || (i > 0 && bytes.Equal(x, d)) // never the primary
			}
			if !gone {
				kept = append(kept, x)
			}
		}
		keys = kept
	default:
		return fmt.Errorf("%w: no site key step in the secrets pushed", store.ErrInvalid)
	}
	if err := bmc.SaveKeyring(k.path, keys); err != nil {
		return err
	}
	if err := k.sealer.SetKeys(keys...); err != nil {
		return err
	}
	k.keys = keys
	k.log.Info("site keyring updated", "primary", bmc.KeyID(keys[0]), "keys", len(keys))
	return nil
}

// rotate replaces the site key (see siteKeys). It returns the new key's ID
// and how many credentials were re-sealed.
func (k *siteKeys) rotate(ctx context.Context, w store.W) (api.SiteKeyRotation, error) {
	k.rotMu.Lock()
	defer k.rotMu.Unlock()
	k.mu.Lock()
	old := append([][]byte(nil), k.keys...)
	k.mu.Unlock()
	key := bmc.NewKey()
	id := bmc.KeyID(key)
	out := api.SiteKeyRotation{KeyID: id, OldKeyIDs: []string{}}
	for _, o := range old {
		out.OldKeyIDs = append(out.OldKeyIDs, bmc.KeyID(o))
	}
	if err := k.st.PushSecrets(ctx, map[string][]byte{secretKeyStage: key}); err != nil {
		return out, fmt.Errorf("rotate-key stopped at step 1 (staging the new key; credentials untouched, still sealed under the old key): %w", err)
	}
	if err := k.st.PushSecrets(ctx, map[string][]byte{secretKeyUse: key}); err != nil {
		return out, fmt.Errorf("rotate-key stopped at step 2 (making the new key primary; every node holds both keys, so every credential opens): run it again: %w", err)
	}
	w.Reason = "site_key_rotated"
	for pass := 0; ; pass++ {
		if err := k.st.Barrier(ctx); err != nil {
			return out, fmt.Errorf("rotate-key step 3 (re-sealing): %w", err)
		}
		names, err := k.st.SecretKeys()
		if err != nil {
			return out, err
		}
		left := 0
		for _, name := range names {
			blob, err := k.st.Secret(name)
			if err != nil {
				if errors.Is(err, store.ErrNotFound) {
					continue
				}
				return out, err
			}
			if bmc.SealedKeyID(blob) == id {
				continue
			}
			left++
			pt, err := k.sealer.Open(blob)
			if err != nil {
				return out, fmt.Errorf("rotate-key step 3: credential %s opens under no key of this node's keyring; old keys are kept: %w", name, err)
			}
			// Narrow (not close) the race with a re-enrollment of the same
			// BMC: skip a credential that changed since it was read; the
			// next pass sees it (sealed under the new key by then).
			if now, err := k.st.Secret(name); err != nil || !bytes.Equal(now, blob) {
				continue
			}
			if err := k.st.PutSecret(ctx, name, k.sealer.Seal(pt), w); err != nil {
				return out, fmt.Errorf("rotate-key step 3: re-seal %s (old keys are kept; run it again): %w", name, err)
			}
			out.Resealed++
		}
		if left == 0 {
			break
		}
		if pass >= 5 {
			return out, fmt.Errorf("rotate-key step 3: credentials still sealed under an old key after %d passes; old keys are kept; run it again", pass+1)
		}
	}
	if err := k.st.PushSecrets(ctx, map[string][]byte{secretKeyDrop: bmc.JoinKeyring(old)}); err != nil {
		return out, fmt.Errorf("rotate-key: every credential is sealed under key %s, but dropping the old keys failed on a member (they still open nothing new; run it again to drop them): %w", id, err)
	}
	k.log.Info("site key rotated", "key_id", id, "resealed", out.Resealed)
	return out, nil
}

// RotateSiteKey is api.SiteKeyBackend (POST /v1/site/rotate-key).
func (b *apiBackend) RotateSiteKey(ctx context.Context, w store.W) (api.SiteKeyRotation, error) {
	if b.keys == nil {
		return api.SiteKeyRotation{}, fmt.Errorf("%w: no site keyring on this node", store.ErrInvalid)
	}
	return b.keys.rotate(ctx, w)
}
