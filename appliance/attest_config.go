package appliance

import (
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"kiln/appliance/attest"
	"kiln/appliance/lifecycle"
)

// AttestConfig is the appliance config's `attest:` section (issue 16;
// appliance/lifecycle/DESIGN.md "Attestation"): the attestation policy per
// hardware model. Zero: no model attests (the gate is open).
type AttestConfig struct {
	// Default applies to every model not listed in Models.
	Default AttestModelConfig `yaml:"default"`
	// Models: one entry per hardware model, "vendor/product" as the
	// agent's inventory reports it (kiln machines get: discovered.vendor,
	// discovered.model).
	Models []AttestModelConfig `yaml:"models"`
	// PCRs quoted and compared (default 0–7 and 9).
	PCRs []int `yaml:"pcrs"`
	// ChallengeTTL bounds a challenge's life (default 2m).
	ChallengeTTL time.Duration `yaml:"challenge_ttl"`
	// EKRoots is a PEM file of the TPM manufacturers' CA certificates an
	// EK certificate must chain to ("": EKs are pinned on first use).
	EKRoots string `yaml:"ek_roots"`
	// RequireEKCert refuses a TPM without an EK certificate.
	RequireEKCert bool `yaml:"require_ek_cert"`
}

// AttestModelConfig is one model's policy: Require (every build attests
// and gets its credentials only after a pass) and NoTPM (refuse, the
// default, or allow: built with label kiln.io/attestation=no-tpm).
type AttestModelConfig struct {
	Model   string `yaml:"model"`
	Require bool   `yaml:"require"`
	NoTPM   string `yaml:"no_tpm"`
}

func (c AttestConfig) validate() error {
	check := func(key string, m AttestModelConfig) error {
		switch m.NoTPM {
		case "", lifecycle.NoTPMRefuse, lifecycle.NoTPMAllow:
			return nil
		}
		return fmt.Errorf("%s.no_tpm: %q is not refuse|allow", key, m.NoTPM)
	}
	if err := check("attest.default", c.Default); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, m := range c.Models {
		key := fmt.Sprintf("attest.models[%d]", i)
		if m.Model == "" || seen[m.Model] {
			return fmt.Errorf("%s.model: required and unique (vendor/product)", key)
		}
		seen[m.Model] = true
		if err := check(key, m); err != nil {
			return err
		}
	}
	for _, p := range c.PCRs {
		if p < 0 || p > 23 {
			return fmt.Errorf("attest.pcrs: %d is not a PCR (0..23)", p)
		}
	}
	if c.ChallengeTTL < 0 {
		return fmt.Errorf("attest.challenge_ttl: negative")
	}
	return nil
}

// lifecycle is the controller's AttestConfig (the EK roots read from their file).
func (c AttestConfig) lifecycle() (lifecycle.AttestConfig, error) {
	out := lifecycle.AttestConfig{PCRs: c.PCRs, ChallengeTTL: c.ChallengeTTL,
		Default: lifecycle.AttestPolicy{Require: c.Default.Require, NoTPM: c.Default.NoTPM},
		Trust:   attest.Trust{RequireCert: c.RequireEKCert}}
	if len(c.Models) > 0 {
		out.Models = map[string]lifecycle.AttestPolicy{}
		for _, m := range c.Models {
			out.Models[m.Model] = lifecycle.AttestPolicy{Require: m.Require, NoTPM: m.NoTPM}
		}
	}
	if c.EKRoots != "" {
		pem, err := os.ReadFile(c.EKRoots)
		if err != nil {
			return out, fmt.Errorf("attest.ek_roots: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return out, fmt.Errorf("attest.ek_roots: %s holds no PEM certificate", c.EKRoots)
		}
		out.Trust.Roots = pool
	}
	return out, nil
}
