package bmc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// qmpQueryStatus asks a qemu QMP socket for its run state (test helper; the bmc package
// itself never talks QMP).
func qmpQueryStatus(ctx context.Context, sock string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	next := func() (map[string]json.RawMessage, error) {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return nil, err
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(line, &m); err != nil {
				return nil, err
			}
			if _, ev := m["event"]; !ev {
				return m, nil
			}
		}
	}
	if _, err := next(); err != nil { // greeting
		return "", err
	}
	for _, cmd := range []string{"qmp_capabilities", "query-status"} {
		if _, err := fmt.Fprintf(conn, "{\"execute\":%q}\n", cmd); err != nil {
			return "", err
		}
		m, err := next()
		if err != nil {
			return "", err
		}
		if cmd == "query-status" {
			var st struct{ Status string }
			if err := json.Unmarshal(m["return"], &st); err != nil {
				return "", err
			}
			return st.Status, nil
		}
	}
	return "", fmt.Errorf("unreachable")
}
