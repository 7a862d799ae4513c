// Command depcheck keeps Kiln's imports pointing one way (top-level
// DESIGN.md "Parts and folders"). The table in rules.go says, per folder, what may import
// what, with the reason for each row; it has no exception list:
//
//   - the protocol packages (dhcp, tftp, httpboot, bmc) and the store import
//     nothing of Kiln's;
//   - api imports the store's types (the package kiln/store) and the domain
//     (appliance/lifecycle and the packages under it: intake, rules);
//   - appliance wires everything: every part but cmd and deploy;
//   - cmd imports appliance and api (and the package kiln/store, whose
//     types the CLI still decodes REST bodies into); the agent
//     (cmd/kiln-agent) only the agent API's wire types (api/agentapi);
//   - deploy's lab harnesses and scripts import nothing of Kiln's outside
//     deploy; the end-to-end flow (deploy/lab/e2e) drives the built
//     binaries through the REST API's client and types, never appliance.
//
// Test files are checked too. A package's tests may import what its row
// allows plus the row's test patterns: the lab's harness packages
// (deploy/lab/..., among them deploy/lab/testkit) for every package, the
// real store (store/...) for api and cmd, Kiln's protocol packages for the
// lab's fakes. An import that only the test patterns allow must not reach,
// through its own imports, anything outside them: a protocol package's test
// that imports the store, directly or through a lab helper, fails.
//
// Every package must sit under a folder of the table: a package in an
// unknown top-level folder (internal/, pkg/, …) or at the module root fails
// the check with a message naming the folder. Files the build ignores
// (another GOOS, a build tag) are read and checked as well.
//
// Usage:
//
//	depcheck [-C dir]
//
// -C names the module root (default "."). depcheck prints one line per
// offending import and exits 1 if there is any, 2 if it cannot list the
// packages (go list failed, a package does not parse), 0 otherwise.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is main with its arguments and outputs, for tests; it returns the
// exit status.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("depcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("C", ".", "module root to check")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "depcheck: unexpected arguments %q\n", fs.Args())
		return 2
	}
	found, n, err := check(*dir, rules)
	if err != nil {
		fmt.Fprintln(stderr, "depcheck:", err)
		return 2
	}
	for _, f := range found {
		fmt.Fprintln(stdout, "depcheck:", f)
	}
	if len(found) > 0 {
		fmt.Fprintf(stdout, "depcheck: %d imports or packages against the rules of deploy/scripts/depcheck/rules.go\n", len(found))
		return 1
	}
	fmt.Fprintf(stdout, "depcheck: %d packages, imports point one way\n", n)
	return 0
}
