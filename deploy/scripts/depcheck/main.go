// Command depcheck enforces the import direction of CONVENTIONS.md rule 1:
// protocol packages (dhcp, tftp, httpboot, bmc) and store import nothing of
// Kiln's; api imports only store and its own subpackages; nothing imports
// appliance except cmd and deploy; nothing imports cmd.
//
// It exits 1 and names every offending import.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

const module = "kiln"

// allowed maps a top-level folder to the top-level folders of ours it may import.
var allowed = map[string][]string{
	"store":     {"store"},
	"dhcp":      {"dhcp"},
	"tftp":      {"tftp"},
	"httpboot":  {"httpboot"},
	"bmc":       {"bmc"},
	"api":       {"api", "store", "appliance/intake"},
	"appliance": {"appliance", "api", "store", "dhcp", "tftp", "httpboot", "bmc"},
	"cmd":       {"cmd", "appliance", "api", "store", "bmc", "dhcp", "tftp", "httpboot"},
	"deploy":    {"deploy", "cmd", "appliance", "api", "store", "bmc", "dhcp", "tftp", "httpboot"},
}

type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func main() {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "depcheck: go list:", err)
		os.Exit(2)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	bad := 0
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			fmt.Fprintln(os.Stderr, "depcheck:", err)
			os.Exit(2)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		top := strings.SplitN(rel, "/", 2)[0]
		rules, ok := allowed[top]
		if !ok {
			continue
		}
		// Test files may reach wider (a test of api may use the real store, etc.) but
		// production imports may not.
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			irel := strings.TrimPrefix(imp, module+"/")
			if !permitted(irel, rules) {
				fmt.Printf("depcheck: %s imports %s (allowed: %s)\n", p.ImportPath, imp, strings.Join(rules, ", "))
				bad++
			}
		}
	}
	if bad > 0 {
		os.Exit(1)
	}
}

func permitted(imp string, rules []string) bool {
	for _, r := range rules {
		if imp == r || strings.HasPrefix(imp, r+"/") {
			return true
		}
	}
	return false
}
