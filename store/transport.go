package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// handshakeTimeout bounds a TLS handshake on the raft and forward ports (a
// peer that connects and sends nothing holds a goroutine only this long).
const handshakeTimeout = 10 * time.Second

// tlsStream is raft's StreamLayer over mutual TLS: the listener requires a
// client certificate signed by the site CA (and not refused by the
// store's peer check), and dials present this node's certificate and verify
// the peer's. It replaces raft.NewTCPTransport's plain TCP.
type tlsStream struct {
	ln     net.Listener
	advert net.Addr
	server *tls.Config
	client *tls.Config
	dialer net.Dialer
}

func newTLSStream(bind string, server, client *tls.Config) (*tlsStream, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	addr, ok := ln.Addr().(*net.TCPAddr)
	if !ok || addr.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("%w: raft address %s is not advertisable: give the address peers reach this node at", ErrInvalid, ln.Addr())
	}
	return &tlsStream{ln: ln, advert: addr, server: server, client: client}, nil
}

// Accept waits for the next connection; its handshake runs on the first
// Read or Write (in raft's per-connection goroutine, not the accept loop),
// bounded by handshakeTimeout.
func (t *tlsStream) Accept() (net.Conn, error) {
	c, err := t.ln.Accept()
	if err != nil {
		return nil, err
	}
	return &hsConn{Conn: tls.Server(c, t.server)}, nil
}

func (t *tlsStream) Close() error { return t.ln.Close() }

func (t *tlsStream) Addr() net.Addr { return t.advert }

// Dial connects to a peer's raft port and completes the handshake within timeout.
func (t *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &t.dialer, Config: t.client}
	c, err := d.DialContext(ctx, "tcp", string(address))
	if err != nil {
		return nil, fmt.Errorf("raft dial %s (mutual TLS): %w", address, err)
	}
	return c, nil
}

// hsConn runs the server handshake once, with a deadline, before the
// first Read or Write.
type hsConn struct {
	*tls.Conn
	once sync.Once
	err  error
}

func (c *hsConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		defer cancel()
		if c.err = c.Conn.HandshakeContext(ctx); c.err != nil {
			c.err = fmt.Errorf("raft: TLS handshake from %s refused: %w", c.RemoteAddr(), c.err)
			_ = c.Conn.Close()
		}
	})
	return c.err
}

func (c *hsConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *hsConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// errUnauthenticated is the forward RPC's answer to a request without a
// verified site certificate.
var errUnauthenticated = errors.New("the forward RPC needs a client certificate signed by the site CA: " +
	"only cluster members may use it; a new node joins with a token from `kiln cluster token create`")
