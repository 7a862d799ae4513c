package store

// Firmware and BIOS baselines per hardware model (issue 17): command 35
// put_baseline, bucket baselines.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

var bBaselines = []byte("baselines") // BaselineID(vendor, model) → Baseline

// Baseline is the approved firmware and BIOS of one hardware model (vendor +
// model as inspection and the BMC report them, compared case-insensitively).
// Its ID is always BaselineID(Vendor, Model).
type Baseline struct {
	Meta
	Vendor string `json:"vendor"`
	Model  string `json:"model"`
	// Firmware is the component versions (component = the Redfish
	// SoftwareInventory Name, e.g. "BIOS"), each with the image Kiln serves
	// for it (an http(s) URL the BMC fetches; "" = compared only, never applied).
	Firmware []BaselineFirmware `json:"firmware,omitempty"`
	// BIOS is the BIOS attributes by name; values as text (integers in
	// decimal, booleans true/false), typed from the BMC's current value when applied.
	BIOS map[string]string `json:"bios,omitempty"`
}

// BaselineFirmware is one component of a Baseline.
type BaselineFirmware struct {
	Component string `json:"component"`
	Version   string `json:"version"`
	ImageURI  string `json:"image_uri,omitempty"`
}

// BaselineID is the ID of the baseline of vendor and model: "bl-" and the
// first 16 hex digits of SHA-256(lower(trim(vendor)) NUL lower(trim(model))).
func BaselineID(vendor, model string) string {
	sum := sha256.Sum256([]byte(strings.ToLower(strings.TrimSpace(vendor)) + "\x00" + strings.ToLower(strings.TrimSpace(model))))
	return "bl-" + hex.EncodeToString(sum[:8])
}

// Baseline limits.
const (
	MaxBaselineFirmware = 64
	MaxBaselineBIOS     = 512
)

func checkBaseline(b *Baseline) error {
	if strings.TrimSpace(b.Vendor) == "" || strings.TrimSpace(b.Model) == "" {
		return fmt.Errorf("%w: baseline needs vendor and model", ErrInvalid)
	}
	if b.ID != BaselineID(b.Vendor, b.Model) {
		return fmt.Errorf("%w: baseline id %q is not BaselineID(vendor, model)", ErrInvalid, b.ID)
	}
	if len(b.Firmware) > MaxBaselineFirmware || len(b.BIOS) > MaxBaselineBIOS {
		return fmt.Errorf("%w: baseline has more than %d components or %d BIOS attributes", ErrInvalid, MaxBaselineFirmware, MaxBaselineBIOS)
	}
	seen := map[string]bool{}
	for _, f := range b.Firmware {
		if f.Component == "" || f.Version == "" || seen[f.Component] {
			return fmt.Errorf("%w: baseline firmware component %q (version %q): empty or repeated", ErrInvalid, f.Component, f.Version)
		}
		seen[f.Component] = true
		if f.ImageURI != "" && !strings.HasPrefix(f.ImageURI, "http://") && !strings.HasPrefix(f.ImageURI, "https://") {
			return fmt.Errorf("%w: baseline image URI %q is not http(s)", ErrInvalid, f.ImageURI)
		}
	}
	for k := range b.BIOS {
		if k == "" || len(k) > 128 {
			return fmt.Errorf("%w: BIOS attribute name %q", ErrInvalid, k)
		}
	}
	return nil
}

// putBaseline is CmdPutBaseline: checked, then compare-and-set like every
// simple record (event baseline/{id} created or updated).
func putBaseline(a *applyCtx, b *Baseline) ([]byte, error) {
	if err := checkBaseline(b); err != nil {
		return nil, err
	}
	return putSimple(a, bBaselines, "baseline", b)
}

// PutBaseline writes the baseline of b.Vendor and b.Model (command 35,
// put_baseline) with compare-and-set on b.ResourceVersion (0: create); the
// ID is set to BaselineID. Errors: ErrInvalid, ErrConflict, ErrNotFound,
// *UnsupportedByClusterError (a node predates command 35), ErrNotLeader.
func (s *Store) PutBaseline(ctx context.Context, b Baseline, w W) (Baseline, error) {
	b.ID = BaselineID(b.Vendor, b.Model)
	if err := checkBaseline(&b); err != nil {
		return Baseline{}, err
	}
	return one[Baseline](s.write(ctx, &command{Type: CmdPutBaseline, W: w, Baseline: &b}))
}

// GetBaseline returns baseline id or ErrNotFound.
func (s *Store) GetBaseline(id string) (Baseline, error) {
	return getRec[Baseline](s.fsm, bBaselines, "baseline", id)
}

// BaselineFor returns the baseline of vendor and model, or ErrNotFound.
func (s *Store) BaselineFor(vendor, model string) (Baseline, error) {
	return s.GetBaseline(BaselineID(vendor, model))
}

// ListBaselines returns every baseline ordered by ID.
func (s *Store) ListBaselines() ([]Baseline, error) { return listRec[Baseline](s.fsm, bBaselines) }
