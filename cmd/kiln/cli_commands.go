package main

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
	"kiln/appliance/lifecycle/rules"
)

// cliOpts are the persistent client flags on the root command.
type cliOpts struct {
	server   string
	token    string
	output   string
	tokenSrc string // where the token came from, set by client(), for hints
}

// addClientCommands adds the client commands (machines, import, images,
// events, status, bmc) and the persistent flags --server, --token and -o to
// root. The daemon (`kiln serve`) is the lead's; these talk to its REST API.
func addClientCommands(root *cobra.Command) {
	o := &cliOpts{}
	server := os.Getenv("KILN_SERVER")
	if server == "" {
		server = defaultServer
	}
	pf := root.PersistentFlags()
	pf.StringVar(&o.server, "server", server, "Kiln API URL (env KILN_SERVER)")
	pf.StringVar(&o.token, "token", "", "API bearer token (env KILN_TOKEN, else the file in KILN_TOKEN_FILE or "+defaultTokenFile+")")
	pf.StringVarP(&o.output, "output", "o", outTable, "output format: table, json or yaml")

	for _, c := range []*cobra.Command{machinesCmd(o), importCmd(o), imagesCmd(o), eventsCmd(o), statusCmd(o), bmcCmd(o),
		sitesCmd(o), racksCmd(o), clusterCmd(o), siteCmd(o), backupCmd(o), restoreCmd(), remediationCmd(o), leasesCmd(o)} {
		o.explainAll(c)
		root.AddCommand(c)
	}
}

// parseLabels turns ["k=v", ...] into a map.
func parseLabels(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want key=value", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

func firstMAC(m api.Machine) string {
	if len(m.Intended.NICs) > 0 {
		return m.Intended.NICs[0].MAC
	}
	return ""
}

func machineTable(ms []api.Machine) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		row(tw, "ID", "NAME", "STATE", "RACK", "U", "MAC", "IPV4", "REASON")
		for _, m := range ms {
			u := "-"
			if m.RackUnit > 0 {
				u = strconv.Itoa(m.RackUnit)
			}
			row(tw, m.ID, dash(m.Name), m.State, dash(m.Rack), u, dash(firstMAC(m)), dash(m.IPv4), dash(m.Reason))
		}
	}
}

func machineDetail(m api.Machine) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		row(tw, "ID:", m.ID)
		row(tw, "Name:", dash(m.Name))
		row(tw, "State:", m.State)
		if m.Reason != "" || m.Message != "" {
			row(tw, "Reason:", dash(m.Reason), m.Message)
		}
		row(tw, "Site/Rack/U:", fmt.Sprintf("%s / %s / %d", dash(m.Site), dash(m.Rack), m.RackUnit))
		row(tw, "Serial:", dash(m.Intended.Serial))
		for _, n := range m.Intended.NICs {
			row(tw, "NIC:", n.MAC, dash(n.Name))
		}
		row(tw, "IPv4:", dash(m.IPv4))
		row(tw, "BMC:", dash(m.BMC))
		keys := make([]string, 0, len(m.Labels))
		for k := range m.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			row(tw, "Label:", k+"="+m.Labels[k])
		}
		if m.Claim != nil {
			row(tw, "Claim:", "image="+m.Claim.Image, "role="+dash(m.Claim.Role), "host="+dash(m.Claim.Hostname))
		}
		releaseDetail(tw, m) // issue 15 (cli_release.go)
		if m.Step != nil {
			row(tw, "Step:", m.Step.Step, m.Step.State, dash(m.Step.Reason), fmt.Sprintf("%.0f%%", m.Step.Progress*100))
		}
		for _, d := range m.Diff {
			row(tw, "Diff:", d.Field, "intended="+d.Intended, "discovered="+d.Discovered, map[bool]string{true: "BLOCKING", false: "warn"}[d.Blocking])
		}
		row(tw, "Version:", m.ResourceVersion)
		row(tw, "Updated:", m.UpdatedAt.Format(time.RFC3339))
	}
}

func machinesCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "machines", Aliases: []string{"machine", "m"}, Short: "List, show and act on machines"}

	var state, rack, after string
	var labels []string
	var limit int
	var all bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List machines (filter by --state, --rack, --label k=v)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			sel, err := parseLabels("label", labels)
			if err != nil {
				return err
			}
			q := client.MachineQuery{State: state, Rack: rack, Labels: sel, Limit: limit}
			var items []api.Machine
			next := after
			for {
				// One request per page, each bounded by requestTimeout.
				q.After = next
				ctx, cancel := timeout(cmd)
				page, err := cl.ListMachines(ctx, q)
				cancel()
				if err != nil {
					return err
				}
				items = append(items, page.Items...)
				next = page.Next
				if next == "" || !all {
					break
				}
			}
			if items == nil {
				items = []api.Machine{}
			}
			if err := render(cmd.OutOrStdout(), o.output, api.MachineList{Items: items, Next: next}, machineTable(items)); err != nil {
				return err
			}
			if next != "" && o.output == outTable {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: --after %s\n", termSafe(next))
			}
			return nil
		},
	}
	list.Flags().StringVar(&state, "state", "", "only machines in this state ("+statesList()+")")
	list.Flags().StringVar(&rack, "rack", "", "only machines of this rack ID")
	list.Flags().StringArrayVar(&labels, "label", nil, "only machines with label key=value (repeat for AND)")
	list.Flags().IntVar(&limit, "limit", api.DefaultListLimit, "page size")
	list.Flags().BoolVar(&all, "all", true, "follow the cursor through every page (--all=false: one page)")
	list.Flags().StringVar(&after, "after", "", "start after this cursor")

	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show one machine",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Machine, error) {
				return cl.GetMachine(ctx, args[0])
			}, machineDetail)
		},
	}

	var claim api.Claim
	var userDataFile, reason string
	var claimLabels []string
	var cluster clusterFlags
	prov := &cobra.Command{
		Use:   "provision ID",
		Short: "Provision an available machine with an image, role and bootstrap data",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			if claim.Image == "" {
				return errors.New("--image is required (see `kiln images list`)")
			}
			if claim.Labels, err = parseLabels("label", claimLabels); err != nil {
				return err
			}
			if claim.Cluster, err = cluster.block(); err != nil {
				return err
			}
			if userDataFile != "" {
				b, err := os.ReadFile(userDataFile)
				if err != nil {
					return fmt.Errorf("--user-data: %w", err)
				}
				claim.UserData = string(b)
			}
			ctx, cancel := timeout(cmd)
			defer cancel()
			m, err := cl.Provision(ctx, args[0], api.ProvisionRequest{Claim: claim, Reason: reason})
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), o.output, m, machineTable([]api.Machine{m}))
		},
	}
	prov.Flags().StringVar(&claim.Image, "image", "", "image ID (required)")
	prov.Flags().StringVar(&claim.Role, "role", "", "role, e.g. worker or control-plane")
	prov.Flags().StringVar(&claim.Hostname, "hostname", "", "host name of the node")
	prov.Flags().StringArrayVar(&claim.SSHKeys, "ssh-key", nil, "authorized SSH public key (repeat)")
	prov.Flags().StringVar(&userDataFile, "user-data", "", "cloud-init user-data file")
	prov.Flags().StringArrayVar(&claimLabels, "label", nil, "node label key=value (repeat)")
	prov.Flags().StringVar(&reason, "reason", "", "why (recorded in the event log)")
	cluster.add(prov)

	c.AddCommand(list, get, prov, claimCmd(o),
		actionCmd(o, "release", "Release a provisioned machine (it is erased, then available)", (*client.Client).Release),
		actionCmd(o, "erase", "Erase a machine's disks", (*client.Client).Erase),
		actionCmd(o, "inspect", "(Re)inspect a machine's hardware", (*client.Client).Inspect))
	c.AddCommand(remediationMachineCmds(o)...) // cli_remediation.go
	return c
}

func statesList() string {
	states := client.States()
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, "|")
}

// actionCmd is `kiln machines VERB ID` for a body-optional action; do is
// the client's method of it (Release, Erase, Inspect).
func actionCmd(o *cliOpts, verb, short string, do func(*client.Client, context.Context, string, api.ActionRequest) (api.Machine, error)) *cobra.Command {
	var reason, message string
	c := &cobra.Command{
		Use:   verb + " ID",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Machine, error) {
				return do(cl, ctx, args[0], api.ActionRequest{Reason: reason, Message: message})
			}, func(m api.Machine) func(*tabwriter.Writer) { return machineTable([]api.Machine{m}) })
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why (recorded in the event log)")
	c.Flags().StringVar(&message, "message", "", "free-text note")
	return c
}

func importCmd(o *cliOpts) *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:   "import FILE",
		Short: "Import a purchase record / rack plan (csv, json or a NetBox device CSV); all or nothing",
		Long: `Import machines as registered. FILE is read whole; "-" reads stdin. The
format comes from --format, else the file extension (.csv, .json). A file with
any bad row imports nothing; each bad row is printed with its line and field.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			if format == "" {
				switch strings.ToLower(filepath.Ext(args[0])) {
				case ".csv":
					format = "csv"
				case ".json":
					format = "json"
				default:
					return fmt.Errorf("cannot tell the format of %q: pass --format csv|json|netbox", args[0])
				}
			}
			var r io.Reader = cmd.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			ctx, cancel := timeout(cmd)
			defer cancel()
			res, err := cl.ImportMachines(ctx, format, r)
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), o.output, res, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "imported %d machine(s)\n", res.Created)
				for _, id := range res.IDs {
					row(tw, id)
				}
			})
		},
	}
	c.Flags().StringVar(&format, "format", "", "csv, json or netbox (default from the file extension)")
	return c
}

func imagesCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "images", Aliases: []string{"image"}, Short: "Upload and list OS images"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.ImageList, error) {
				items, err := cl.ListImages(ctx)
				return api.ImageList{Items: items}, err
			}, func(il api.ImageList) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					row(tw, "ID", "NAME", "VERSION", "FORMAT", "SIZE", "SHA256")
					for _, im := range il.Items {
						row(tw, im.ID, im.Name, im.Version, im.Format, im.Size, short(im.SHA256))
					}
				}
			})
		},
	}
	var name, version, sum, format, id string
	var rawSize uint64
	var quiet bool
	up := &cobra.Command{
		Use:   "upload FILE",
		Short: "Upload an image, streaming it with a progress bar",
		Long: `Upload FILE as an image. Its SHA-256 is --sha256 when given, else computed
first (a read of the whole file); the server checks the bytes against it.
--format defaults from the extension: .gz gzip, .zst zstd, else raw.
For gzip and zstd, --sha256 and --size are those of the decompressed content
(what the agent writes and verifies); when either is absent the file is
decompressed once here to compute them.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			if version == "" {
				return errors.New("--version is required (e.g. --version 24.04.1)")
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			if name == "" {
				name = strings.TrimSuffix(filepath.Base(args[0]), filepath.Ext(args[0]))
			}
			if format == "" {
				switch strings.ToLower(filepath.Ext(args[0])) {
				case ".gz":
					format = "gzip"
				case ".zst":
					format = "zstd"
				default:
					format = "raw"
				}
			}
			bar := func(desc string) *progressbar.ProgressBar {
				return progressbar.NewOptions64(fi.Size(), progressbar.OptionSetWriter(cmd.ErrOrStderr()),
					progressbar.OptionSetDescription(desc), progressbar.OptionShowBytes(true),
					progressbar.OptionSetVisibility(!quiet), progressbar.OptionThrottle(100*time.Millisecond),
					progressbar.OptionShowCount(), progressbar.OptionOnCompletion(func() { fmt.Fprintln(cmd.ErrOrStderr()) }))
			}
			if format != "raw" && (sum == "" || rawSize == 0) {
				b := bar("hashing  ")
				rsum, rsize, err := rawDigest(io.TeeReader(f, b), format)
				if err != nil {
					return fmt.Errorf("decompress %s (%s): %w", args[0], format, err)
				}
				_ = b.Finish()
				if sum != "" && !strings.EqualFold(sum, rsum) {
					return fmt.Errorf("--sha256 %s does not match the decompressed content of %s (%s)", sum, args[0], rsum)
				}
				if rawSize != 0 && rawSize != rsize {
					return fmt.Errorf("--size %d does not match the decompressed content of %s (%d bytes)", rawSize, args[0], rsize)
				}
				sum, rawSize = rsum, rsize
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return err
				}
			}
			if sum == "" {
				h := sha256.New()
				b := bar("hashing  ")
				if _, err := io.Copy(io.MultiWriter(h, b), f); err != nil {
					return fmt.Errorf("hash %s: %w", args[0], err)
				}
				_ = b.Finish()
				sum = hex.EncodeToString(h.Sum(nil))
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return err
				}
			}
			b := bar("uploading")
			pr := progressbar.NewReader(f, b)
			meta := client.ImageMeta{Name: name, Version: version, SHA256: sum, Format: format, Size: rawSize, Source: filepath.Base(args[0])}
			// No overall timeout: an image may take long; Ctrl-C cancels.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var im api.Image
			if id != "" {
				im, _, err = cl.PutImage(ctx, id, meta, &pr, fi.Size())
			} else {
				im, err = cl.UploadImage(ctx, meta, &pr, fi.Size())
			}
			if err != nil {
				return err
			}
			_ = b.Finish()
			return render(cmd.OutOrStdout(), o.output, im, func(tw *tabwriter.Writer) {
				row(tw, "ID", "NAME", "VERSION", "FORMAT", "SIZE", "SHA256")
				row(tw, im.ID, im.Name, im.Version, im.Format, im.Size, im.SHA256)
			})
		},
	}
	up.Flags().StringVar(&name, "name", "", "image name (default: the file name without extension)")
	up.Flags().StringVar(&version, "version", "", "image version (required)")
	up.Flags().StringVar(&sum, "sha256", "", "expected SHA-256 (hex) of the image: of the file when raw, of its decompressed content when gzip or zstd; computed when absent")
	up.Flags().Uint64Var(&rawSize, "size", 0, "bytes of the decompressed content (gzip, zstd); computed when absent")
	up.Flags().StringVar(&format, "format", "", "raw, gzip or zstd (default from the extension)")
	up.Flags().StringVar(&id, "id", "", "store under this image ID (default: assigned)")
	up.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	c.AddCommand(list, up, manifestCmd(o)) // manifest: cli_release.go
	return c
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func eventsCmd(o *cliOpts) *cobra.Command {
	var after uint64
	var limit int
	var follow bool
	var wait time.Duration
	c := &cobra.Command{
		Use:   "events",
		Short: "Print the event log after a cursor; --follow keeps waiting for new events",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if follow {
				var stop context.CancelFunc
				ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
				defer stop()
			}
			w := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			header := o.output == outTable
			for {
				q := client.EventQuery{After: after, Limit: limit}
				if follow {
					q.Wait = wait
				}
				rctx, cancel := context.WithTimeout(ctx, requestTimeout+q.Wait)
				el, err := cl.Events(rctx, q)
				cancel()
				if err != nil {
					if follow && ctx.Err() != nil {
						return nil // Ctrl-C or the caller's context ended
					}
					return err
				}
				if err := printEvents(w, tw, o.output, el, &header, follow); err != nil {
					return err
				}
				after = el.Next
				if !follow && (len(el.Events) < limit || len(el.Events) == 0) {
					return nil
				}
			}
		},
	}
	c.Flags().Uint64Var(&after, "after", 0, "cursor: print events after this index")
	c.Flags().IntVar(&limit, "limit", api.DefaultListLimit, "events per request")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep waiting for new events (long-poll)")
	c.Flags().DurationVar(&wait, "wait", 30*time.Second, "long-poll wait per request with --follow")
	return c
}

// printEvents prints one batch: table rows, one JSON object per line (so
// --follow -o json is a stream), or YAML documents.
func printEvents(w io.Writer, tw *tabwriter.Writer, format string, el api.EventList, header *bool, follow bool) error {
	switch format {
	case outTable:
		if *header {
			row(tw, "INDEX", "TIME", "SUBJECT", "KIND", "CHANGE", "ACTOR", "REASON", "MESSAGE")
			*header = false
		}
		for _, e := range el.Events {
			change := "-"
			if e.From != "" || e.To != "" {
				change = dash(e.From) + "→" + dash(e.To)
			}
			row(tw, e.Index, e.Time.Format(time.RFC3339), e.Subject, e.Kind, change, dash(e.Actor), dash(e.Reason), dash(oneLine(e.Message, 100)))
		}
		return tw.Flush()
	case outJSON:
		enc := json.NewEncoder(w) // compact: one object per line (JSON Lines)
		for _, e := range el.Events {
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
		return nil
	default:
		for _, e := range el.Events {
			fmt.Fprintln(w, "---")
			if err := render(w, outYAML, e, nil); err != nil {
				return err
			}
		}
		return nil
	}
}

// oneLine makes s fit one table cell: characters free text may not hold
// (rules.TextRune: tabs, newlines, other controls) become spaces and it is
// cut to max runes with "…".
func oneLine(s string, max int) string {
	r := []rune(strings.Map(func(c rune) rune {
		if !rules.TextRune(c) {
			return ' '
		}
		return c
	}, s))
	if len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return string(r)
}

// rawDigest decompresses r (format gzip or zstd) and returns the hex SHA-256
// and length in bytes of the content.
func rawDigest(r io.Reader, format string) (string, uint64, error) {
	var dr io.Reader
	switch format {
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return "", 0, err
		}
		defer zr.Close()
		dr = zr
	case "zstd":
		zr, err := zstd.NewReader(r)
		if err != nil {
			return "", 0, err
		}
		defer zr.Close()
		dr = zr
	default:
		return "", 0, fmt.Errorf("format %q: want raw, gzip or zstd", format)
	}
	h := sha256.New()
	n, err := io.Copy(h, dr)
	if err != nil {
		return "", 0, err
	}
	if n == 0 {
		return "", 0, errors.New("the decompressed content is empty")
	}
	return hex.EncodeToString(h.Sum(nil)), uint64(n), nil
}

func statusCmd(o *cliOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Site status: machines by state, failures, versions, raft health",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.SiteStatus, error) {
				return cl.SiteStatus(ctx)
			}, func(st api.SiteStatus) func(*tabwriter.Writer) {
				return func(tw *tabwriter.Writer) {
					role := "follower"
					if st.Raft.IsLeader {
						role = "leader"
					}
					ready := "ready"
					if !st.Raft.Ready {
						ready = "NOT READY"
					}
					row(tw, "Version:", st.Version)
					row(tw, "Raft:", role, "leader="+dash(st.Raft.Leader), ready)
					if st.Raft.Halted != "" {
						row(tw, "HALTED:", st.Raft.Halted)
					}
					row(tw, "Machines:", st.Total)
					for _, s := range client.States() {
						if n := st.Counts[s]; n > 0 {
							row(tw, "  "+string(s)+":", n)
						}
					}
					for _, im := range st.Images {
						row(tw, "Image:", im.ID, im.Name+" "+im.Version, "on "+dash(strings.Join(im.Nodes, ",")))
					}
					envRows(tw, st.Environment)
					if len(st.Failures) > 0 {
						row(tw, "Failures:")
						for _, f := range st.Failures {
							row(tw, "  "+f.ID, dash(f.Name), dash(f.Rack), dash(f.Reason), f.Message)
						}
					}
				}
			})
		},
	}
}

// envRows shows the in-RAM environment comparison of the site status: one
// line, then one per node with 12-digit digest prefixes.
func envRows(tw *tabwriter.Writer, e *api.EnvStatus) {
	if e == nil {
		return
	}
	verdict := "same on every node"
	if e.Mismatch {
		verdict = "MISMATCH: a node whose environment is not the site's does not serve it"
	}
	row(tw, "Environment:", verdict)
	short := func(d map[string]string, name string) string {
		if v := d[name]; len(v) >= 12 {
			return name + "=" + v[:12]
		}
		return name + "=-"
	}
	for _, n := range e.Nodes {
		state := "ok"
		switch {
		case len(n.Files) == 0:
			state = "reports none"
		case !n.Match:
			state = "DIFFERS: not served"
		}
		row(tw, "  "+n.Node, short(n.Files, "vmlinuz"), short(n.Files, "initramfs"), state)
	}
}

func bmcCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "bmc", Short: "Manage machines' BMCs"}
	var req api.BMCEnrollRequest
	var pwFile string
	var pwStdin bool
	enroll := &cobra.Command{
		Use:   "enroll MACHINE",
		Short: "Enroll a machine's BMC (the password is stored encrypted, never shown)",
		Long: `Enroll the BMC of MACHINE. The password comes from --password-file,
--password-stdin or env KILN_BMC_PASSWORD — never from a flag, so it stays out
of shell history and ps.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			switch {
			case pwFile != "":
				b, err := os.ReadFile(pwFile)
				if err != nil {
					return fmt.Errorf("--password-file: %w", err)
				}
				req.Password = strings.TrimRight(string(b), "\r\n")
			case pwStdin:
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 4096))
				if err != nil {
					return err
				}
				req.Password = strings.TrimRight(string(b), "\r\n")
			default:
				req.Password = os.Getenv("KILN_BMC_PASSWORD")
			}
			if req.Password == "" {
				return errors.New("no BMC password: use --password-file, --password-stdin or KILN_BMC_PASSWORD")
			}
			ctx, cancel := timeout(cmd)
			defer cancel()
			b, err := cl.EnrollBMC(ctx, args[0], req)
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), o.output, b, func(tw *tabwriter.Writer) {
				row(tw, "ID", "ADDRESS", "DRIVER", "USERNAME")
				row(tw, b.ID, b.Address, b.Driver, b.Username)
			})
		},
	}
	enroll.Flags().StringVar(&req.Address, "address", "", "BMC host or host:port (required)")
	enroll.Flags().StringVar(&req.Driver, "driver", "auto", "redfish, ipmi or auto")
	enroll.Flags().StringVar(&req.Username, "username", "", "BMC user name (required)")
	enroll.Flags().StringVar(&pwFile, "password-file", "", "file holding the BMC password")
	enroll.Flags().BoolVar(&pwStdin, "password-stdin", false, "read the BMC password from stdin")
	enroll.Flags().BoolVar(&req.InsecureTLS, "insecure-tls", false, "do not verify the BMC's TLS certificate (Redfish)")
	c.AddCommand(enroll)
	return c
}
