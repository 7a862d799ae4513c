package vbmc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// Errors of the QMP client.
var (
	// ErrQMP is returned for a QMP error reply or a malformed QMP message.
	ErrQMP = errors.New("vbmc: qmp")
)

// qmpMessage is one line of the QMP wire protocol (qemu docs/interop/qmp-spec):
// a greeting {"QMP":...}, a reply {"return":...} / {"error":{class,desc}}, or an
// asynchronous {"event":...}.
type qmpMessage struct {
	QMP    json.RawMessage `json:"QMP"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// parseQMPLine decodes one QMP line strictly: exactly one of greeting, return, error or
// event must be present.
func parseQMPLine(b []byte) (qmpMessage, error) {
	var m qmpMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: bad message: %v", ErrQMP, err)
	}
	n := 0
	if m.QMP != nil {
		n++
	}
	if m.Return != nil {
		n++
	}
	if m.Error != nil {
		n++
	}
	if m.Event != "" {
		n++
	}
	if n != 1 {
		return m, fmt.Errorf("%w: message has %d of greeting/return/error/event", ErrQMP, n)
	}
	return m, nil
}

// QMP runs one command (with optional arguments) on the QMP unix socket at sock and
// returns its "return" value. It performs the capabilities negotiation first.
func QMP(ctx context.Context, sock, command string, args any) (json.RawMessage, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", ErrQMP, sock, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	r := bufio.NewReader(conn)
	read := func() (qmpMessage, error) {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return qmpMessage{}, fmt.Errorf("%w: read: %v", ErrQMP, err)
			}
			m, err := parseQMPLine(line)
			if err != nil || m.Event == "" {
				return m, err
			}
		}
	}
	if m, err := read(); err != nil {
		return nil, err
	} else if m.QMP == nil {
		return nil, fmt.Errorf("%w: no greeting", ErrQMP)
	}
	exec := func(cmd string, a any) (json.RawMessage, error) {
		req := map[string]any{"execute": cmd}
		if a != nil {
			req["arguments"] = a
		}
		b, _ := json.Marshal(req)
		if _, err := conn.Write(append(b, '\n')); err != nil {
			return nil, fmt.Errorf("%w: write: %v", ErrQMP, err)
		}
		m, err := read()
		if err != nil {
			return nil, err
		}
		if m.Error != nil {
			return nil, fmt.Errorf("%w: %s: %s: %s", ErrQMP, cmd, m.Error.Class, m.Error.Desc)
		}
		if m.Return == nil {
			return nil, fmt.Errorf("%w: %s: unexpected greeting", ErrQMP, cmd)
		}
		return m.Return, nil
	}
	if _, err := exec("qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return exec(command, args)
}

// QueryStatus returns qemu's run state ("running", "paused", "prelaunch", ...) through
// QMP query-status.
func QueryStatus(ctx context.Context, sock string) (string, error) {
	raw, err := QMP(ctx, sock, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.Status == "" {
		return "", fmt.Errorf("%w: query-status answer %q", ErrQMP, raw)
	}
	return st.Status, nil
}
