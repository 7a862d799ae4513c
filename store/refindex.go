package store

import (
	"sort"
	"strings"
)

// The reference index: for each name, intended serial, BMC MAC and claimed
// image ID, the machines holding it. The FSM reads it to decide the rules
// that span records (CmdImportMachines: a value held by another machine;
// CmdDeleteImageV2: an image a claim names) inside the apply instead of by
// scanning every machine. Like the rest of machineIndex it is derived from
// the machine records only (rebuilt on Restore, checked against a rebuild
// by the tests) and maintained through idxTx so that a rolled-back
// transaction leaves it untouched.

// refKind says which machine field a refKey indexes.
type refKind uint8

const (
	refName       refKind = iota + 1 // Machine.Name
	refSerial                        // Intended.Serial, upper-case (serials compare case-insensitively)
	refBMCMAC                        // Intended.BMCMAC, lower-case colon form
	refClaimImage                    // Claim.Image (the image ID a claim names)
)

// refKey is one indexed value of a machine. Several machines may hold the
// same key (every machine claiming one image; records written before a
// rule refused duplicates), so each key maps to a set.
type refKey struct {
	kind refKind
	val  string
}

// refList is a machine's indexed values (at most one per refKind), kept by
// value so that computing it allocates nothing.
type refList struct {
	n int
	k [4]refKey
}

func (l *refList) add(k refKey) { l.k[l.n] = k; l.n++ }

func (l *refList) keys() []refKey { return l.k[:l.n] }

func (l *refList) has(k refKey) bool {
	for _, e := range l.k[:l.n] {
		if e == k {
			return true
		}
	}
	return false
}

// machineRefs returns m's indexed values (empty values are not indexed; a
// nil m has none).
func machineRefs(m *Machine) (l refList) {
	if m == nil {
		return l
	}
	if m.Name != "" {
		l.add(refKey{refName, m.Name})
	}
	if m.Intended.Serial != "" {
		l.add(refKey{refSerial, serialKey(m.Intended.Serial)})
	}
	if m.Intended.BMCMAC != "" {
		l.add(refKey{refBMCMAC, macKey(m.Intended.BMCMAC)})
	}
	if m.Claim != nil && m.Claim.Image != "" {
		l.add(refKey{refClaimImage, m.Claim.Image})
	}
	return l
}

// serialKey is the form serials are compared in: vendors print them in
// either case.
func serialKey(s string) string { return strings.ToUpper(strings.TrimSpace(s)) }

// macKey is the lower-case colon form of mac, or mac lower-cased when it
// does not parse (a stored value written before MACs were checked).
func macKey(mac string) string {
	if n, err := NormalizeMAC(mac); err == nil {
		return n
	}
	return strings.ToLower(strings.TrimSpace(mac))
}

// refSet is the set of machine IDs holding one refKey, in a canonical form
// (so an index maintained write by write equals one rebuilt from the
// records): min is the smallest ID, kept inline so that the usual single
// holder costs no allocation; more holds the others (nil when none).
type refSet struct {
	min  string
	more map[string]struct{}
}

func (s refSet) has(id string) bool {
	if s.min == id {
		return true
	}
	_, ok := s.more[id]
	return ok
}

// ids returns the holders, sorted.
func (s refSet) ids() []string {
	if s.min == "" {
		return nil
	}
	out := make([]string, 0, 1+len(s.more))
	out = append(out, s.min)
	for id := range s.more {
		out = append(out, id)
	}
	sort.Strings(out[1:])
	return out
}

func (ix *machineIndex) addRef(k refKey, id string) {
	s := ix.ref[k]
	switch {
	case s.has(id):
		return
	case s.min == "":
		s.min = id
	default:
		if s.more == nil {
			s.more = map[string]struct{}{}
		}
		if id < s.min {
			s.more[s.min] = struct{}{}
			s.min = id
		} else {
			s.more[id] = struct{}{}
		}
	}
	ix.ref[k] = s
}

func (ix *machineIndex) delRef(k refKey, id string) {
	s, ok := ix.ref[k]
	if !ok {
		return
	}
	if s.min == id {
		s.min = ""
		for o := range s.more {
			if s.min == "" || o < s.min {
				s.min = o
			}
		}
		delete(s.more, s.min)
	} else {
		delete(s.more, id)
	}
	if len(s.more) == 0 {
		s.more = nil
	}
	if s.min == "" {
		delete(ix.ref, k)
		return
	}
	ix.ref[k] = s
}

// refDelta is one transaction's changes to the holders of one key: the
// first changed ID inline (the usual case: one machine per key per
// transaction), further ones in more. holds false means removed.
type refDelta struct {
	id    string
	holds bool
	more  map[string]bool
}

func (d *refDelta) set(id string, holds bool) {
	if d.id == "" || d.id == id {
		d.id, d.holds = id, holds
		return
	}
	if d.more == nil {
		d.more = map[string]bool{}
	}
	d.more[id] = holds
}

func (d refDelta) get(id string) (holds, ok bool) {
	if d.id == id && id != "" {
		return d.holds, true
	}
	holds, ok = d.more[id]
	return holds, ok
}

func (d refDelta) each(fn func(id string, holds bool)) {
	if d.id != "" {
		fn(d.id, d.holds)
	}
	for id, holds := range d.more {
		fn(id, holds)
	}
}

// setRefs replaces machine id's indexed values old (empty for a new
// machine) by new (empty for a deleted one); values in both are untouched.
func (x *idxTx) setRefs(id string, old, new refList) {
	mark := func(k refKey, holds bool) {
		d := x.ref[k]
		d.set(id, holds)
		x.ref[k] = d
	}
	for _, k := range old.keys() {
		if !new.has(k) {
			mark(k, false)
		}
	}
	for _, k := range new.keys() {
		if !old.has(k) {
			mark(k, true)
		}
	}
}

// holders returns the IDs of the machines holding k at this point of the
// transaction, sorted (so an error naming the first is the same on every
// replica).
func (x *idxTx) holders(k refKey) []string {
	base := x.base.ref[k]
	d, changed := x.ref[k]
	if !changed {
		return base.ids()
	}
	var out []string
	for _, id := range base.ids() {
		if holds, ok := d.get(id); !ok || holds {
			out = append(out, id)
		}
	}
	d.each(func(id string, holds bool) {
		if holds && !base.has(id) {
			out = append(out, id)
		}
	})
	sort.Strings(out)
	return out
}

// commitRefs merges the transaction's reference changes into the
// committed index (called by commit).
func (x *idxTx) commitRefs() {
	for k, d := range x.ref {
		d.each(func(id string, holds bool) {
			if holds {
				x.base.addRef(k, id)
			} else {
				x.base.delRef(k, id)
			}
		})
	}
}
