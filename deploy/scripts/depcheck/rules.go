package main

// rules is the table of which of Kiln's packages may import which
// (top-level DESIGN.md "Parts and folders"). A row covers its folder and
// every package under it; the row with the longest folder wins
// (cmd/kiln-agent over cmd). Every top-level folder that holds Go code has a
// row: a package in a folder with none fails the check.
//
// Patterns: "store" is the package kiln/store alone; "store/..." is
// kiln/store and every package under it.
//
// may is what the row's non-test files may import. tests is what its test
// files (package and external _test.go) may import besides may. A test
// import that only tests allows must not reach, through its own non-test
// imports, anything outside may and tests, so a helper cannot carry a test
// where the test may not go (a protocol package's test importing
// deploy/lab/e2e, which imports the store, fails); what a test import that
// may allows reaches is checked by that package's own row. Every row
// outside deploy has deploy/lab/... among its tests: the lab's harness
// packages (testkit, ipmilab, qemuvm, vbmc) import nothing of Kiln's outside
// deploy, so they take a test nowhere else.
var rules = []rule{
	// The protocol packages and the store import nothing of Kiln's: each
	// declares the small interface it needs where it uses it, and appliance
	// adapts the store to it.
	{folder: "dhcp", may: []string{"dhcp/..."}, tests: lab},
	{folder: "tftp", may: []string{"tftp/..."}, tests: lab},
	{folder: "httpboot", may: []string{"httpboot/..."}, tests: lab},
	{folder: "bmc", may: []string{"bmc/..."}, tests: lab},
	{folder: "store", may: []string{"store/..."}, tests: lab},

	// api is HTTP only: it imports the store's types (the package kiln/store,
	// not storetest) and the domain, appliance/lifecycle and the packages the
	// domain owns under it (intake, rules). Its tests may also run the real
	// store (store/storetest).
	{folder: "api", may: []string{"api/...", "store", "appliance/lifecycle/..."}, tests: append([]string{"store/..."}, lab...)},

	// appliance wires everything: it may import every part but cmd and
	// deploy.
	{folder: "appliance", may: []string{"appliance/...", "api/...", "store/...", "dhcp/...", "tftp/...", "httpboot/...", "bmc/..."}, tests: lab},

	// cmd/kiln runs the appliance (`kiln serve`) and is the CLI over the
	// REST API: it imports appliance and api (the client, kiln/api/client,
	// and the wire types), never the store, whose records the CLI sees only
	// as api's views. Its tests may run the real store (store/storetest).
	{folder: "cmd", may: []string{"cmd/...", "appliance/...", "api/..."}, tests: append([]string{"store/..."}, lab...)},
	// The in-RAM agent shares only the agent API's wire types with Kiln.
	{folder: "cmd/kiln-agent", may: []string{"cmd/kiln-agent/...", "api/agentapi"}, tests: lab},
	// The first-boot reporter runs in the installed OS: the same, the wire types only.
	{folder: "cmd/kiln-firstboot", may: []string{"cmd/kiln-firstboot/...", "api/agentapi"}, tests: lab},

	// deploy: how a site installs and tests Kiln. Its lab harnesses and
	// scripts import nothing of Kiln's outside deploy; their tests may drive
	// a lab fake with Kiln's own protocol code as the peer (vbmc with bmc).
	{folder: "deploy", may: []string{"deploy/..."}, tests: []string{"dhcp/...", "tftp/...", "httpboot/...", "bmc/..."}},
	// The end-to-end flow drives the built binaries from outside, as an
	// operator does: through the REST API's client and wire types
	// (kiln/api/client, kiln/api) and the built CLI, never by importing
	// appliance or the store. It reads the agent's specification of the
	// disk it must find after a build (cmd/kiln-agent/agent: the stage
	// partition's size and layout), which imports only api/agentapi.
	{folder: "deploy/lab/e2e", may: []string{"deploy/lab/...", "api/...", "cmd/kiln-agent/agent"}},
	{folder: "deploy/lab/demo", may: []string{"deploy/lab/..."}},
	// The lab OS builder's boot test receives the first-boot report: it decodes
	// the agent API's wire type, as Kiln does.
	{folder: "deploy/lab/labos", may: []string{"deploy/lab/..."}, tests: []string{"api/agentapi"}},
	// The fleet simulator speaks the agent API as the in-RAM agent does, so
	// it shares the agent's wire types, and its TPM machines run the agent's
	// own attestation exchange (cmd/kiln-agent/agent AttestTPM, which imports
	// only api/agentapi); everything else of Kiln it reaches from outside
	// (the built bin/kiln, the REST API as plain HTTP).
	{folder: "deploy/lab/fleetsim", may: []string{"deploy/lab/...", "api/agentapi", "cmd/kiln-agent/..."}},
	// The scripts (depcheck, pkgcheck) read the repository as data and
	// import nothing of Kiln's, so they run on a tree that does not build.
	{folder: "deploy/scripts", may: []string{"deploy/scripts/..."}},
}

// lab is what the tests of every package outside deploy may import besides
// their row's may: the lab's harness packages. The deploy row keeps them to
// deploy/...; the test rule checks everything they reach.
// cmd/kiln-agent/...: the in-RAM agent's packages (they import only
// api/agentapi), reached through the fleet simulator, whose TPM machines run
// the agent's attestation exchange.
var lab = []string{"deploy/lab/...", "cmd/kiln-agent/..."}
