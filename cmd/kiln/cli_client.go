package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
)

// Client-side defaults.
const (
	defaultServer    = client.DefaultServer
	defaultTokenFile = "/var/lib/kiln/admin.token"
	// requestTimeout bounds ordinary requests; uploads and long-polls set their own.
	requestTimeout = 60 * time.Second
)

// resolveToken returns the token from the flag, KILN_TOKEN, KILN_TOKEN_FILE
// or the default admin token file, and where it came from.
func resolveToken(flag string) (string, string) {
	if flag != "" {
		return flag, "--token"
	}
	if t := os.Getenv("KILN_TOKEN"); t != "" {
		return t, "KILN_TOKEN"
	}
	path := os.Getenv("KILN_TOKEN_FILE")
	if path == "" {
		path = defaultTokenFile
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	return strings.TrimSpace(string(b)), path
}

// client builds the API client (package kiln/api/client) from the flags;
// it checks -o too.
func (o *cliOpts) client() (*client.Client, error) {
	if err := checkOutput(o.output); err != nil {
		return nil, err
	}
	tok, src := resolveToken(o.token)
	cl, err := client.New(client.Config{Server: o.server, Token: tok})
	if err != nil {
		return nil, fmt.Errorf("--server %q: want http://HOST:PORT or https://HOST:PORT", o.server)
	}
	o.tokenSrc = src
	return cl, nil
}

func timeout(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), requestTimeout)
}

// show is the shape every simple command shares: build the client, make one
// call bounded by requestTimeout, and render its answer (-o) with table.
func show[T any](o *cliOpts, cmd *cobra.Command, call func(context.Context, *client.Client) (T, error), table func(T) func(*tabwriter.Writer)) error {
	cl, err := o.client()
	if err != nil {
		return err
	}
	ctx, cancel := timeout(cmd)
	defer cancel()
	v, err := call(ctx, cl)
	if err != nil {
		return err
	}
	return render(cmd.OutOrStdout(), o.output, v, table(v))
}

// cliError is an API error as the CLI prints it: the server's text escaped
// for the terminal (termSafe) and the hint in terms of this CLI's flags and
// commands.
type cliError struct {
	e    *client.Error
	hint string
}

func (c *cliError) Error() string { return c.e.Format(c.hint, termSafe) }
func (c *cliError) Unwrap() error { return c.e }

// explain turns an error of a client command into what the CLI prints: an
// API error gets the CLI's hint (hint), a refused connection says how to
// reach the server; anything else is returned as it is.
func (o *cliOpts) explain(err error) error {
	if err == nil {
		return nil
	}
	if e := client.AsError(err); e != nil {
		return &cliError{e: e, hint: o.hint(e)}
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return fmt.Errorf("cannot reach kiln at %s: %v — is `kiln serve` running? set --server or KILN_SERVER", o.server, oe.Err)
	}
	return err
}

// hint says what to do next about an API error, in terms of this CLI: where
// the token came from, which command shows a machine's state. Otherwise the
// client's own hint (client.Error.Hint).
func (o *cliOpts) hint(e *client.Error) string {
	switch {
	case e.Status == http.StatusUnauthorized && o.tokenSrc == "":
		return "no token: set KILN_TOKEN or --token (the admin token is in " + defaultTokenFile + ")"
	case e.Status == http.StatusUnauthorized:
		return "set KILN_TOKEN or --token (the rejected token came from " + o.tokenSrc + ")"
	case e.Code() == api.CodeIllegalTransition:
		return fmt.Sprintf("the machine is %s; see `kiln machines get` for its state and reason", termSafe(e.Detail.From))
	case e.Status == http.StatusConflict && e.Code() != api.CodeConflict && e.Code() != api.CodeImageInUse:
		return "see `kiln machines get ID` for its state and reason"
	case e.Status == http.StatusNotFound:
		return "check the ID with `kiln machines list` / `kiln images list`"
	case e.Detail.Field != "":
		return "fix " + termSafe(e.Detail.Field)
	}
	return e.Hint()
}

// explainAll makes every command under c return its errors through
// o.explain.
func (o *cliOpts) explainAll(c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error { return o.explain(run(cmd, args)) }
	}
	for _, sub := range c.Commands() {
		o.explainAll(sub)
	}
}
