package controllers

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kclient "kiln/api/client"

	infrav1 "kiln/cmd/kiln-capi/api/v1alpha1"
)

// Kilns makes and caches one Kiln API client per (server, token, CA) a
// KilnCluster names; the token and CA are read from their Secrets on
// every call, so a rotated token is picked up at the next reconcile.
type Kilns struct {
	mu      sync.Mutex
	clients map[[32]byte]*kclient.Client
	byCl    map[string]*kclient.Client // "namespace/cluster" → the last client that worked
	// Timeout bounds each Kiln API call (default 30 s).
	Timeout time.Duration
	// Transport, when set, carries the calls instead of a clone of
	// http.DefaultTransport (a caSecretRef is then not applied): a proxy
	// of the operator's, or the lab's namespace dialer in the end-to-end
	// test.
	Transport http.RoundTripper
}

// For returns the Kiln client of kc. Errors name the Secret or key that is
// missing, or the bad server URL.
func (k *Kilns) For(ctx context.Context, c client.Reader, kc *infrav1.KilnCluster) (*kclient.Client, error) {
	ep := kc.Spec.Kiln
	tok, err := secretValue(ctx, c, kc.Namespace, ep.TokenSecretRef, "token")
	if err != nil {
		return nil, err
	}
	var ca []byte
	if ep.CASecretRef != nil {
		if ca, err = secretValue(ctx, c, kc.Namespace, *ep.CASecretRef, "ca.crt"); err != nil {
			return nil, err
		}
	}
	key := sha256.Sum256([]byte(ep.Server + "\x00" + string(tok) + "\x00" + string(ca)))
	k.mu.Lock()
	defer k.mu.Unlock()
	if cl, ok := k.clients[key]; ok {
		return cl, nil
	}
	var rt http.RoundTripper = k.Transport
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ExpectContinueTimeout = time.Second
	if rt == nil {
		rt = tr
	}
	if len(ca) > 0 && k.Transport == nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("secret %s/%s: no PEM certificate in the CA bundle", kc.Namespace, ep.CASecretRef.Name)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	timeout := k.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	cl, err := kclient.New(kclient.Config{Server: ep.Server, Token: strings.TrimSpace(string(tok)),
		HTTPClient: &http.Client{Transport: rt, Timeout: timeout}})
	if err != nil {
		return nil, err
	}
	if k.clients == nil {
		k.clients = map[[32]byte]*kclient.Client{}
	}
	k.clients[key] = cl
	return cl, nil
}

func (k *Kilns) remember(ns, cluster string, cl *kclient.Client) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.byCl == nil {
		k.byCl = map[string]*kclient.Client{}
	}
	k.byCl[ns+"/"+cluster] = cl
}

// last is the client remember last kept for the cluster (nil if none:
// this process never reached that cluster's Kiln).
func (k *Kilns) last(ns, cluster string) *kclient.Client {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.byCl[ns+"/"+cluster]
}

func secretValue(ctx context.Context, c client.Reader, ns string, ref infrav1.SecretKeyRef, def string) ([]byte, error) {
	key := ref.Key
	if key == "" {
		key = def
	}
	var s corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &s); err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w", ns, ref.Name, err)
	}
	v, ok := s.Data[key]
	if !ok || len(v) == 0 {
		return nil, fmt.Errorf("secret %s/%s has no key %q", ns, ref.Name, key)
	}
	return v, nil
}

// kilnCode is the Kiln API error code of err ("" when err is not an API
// answer).
func kilnCode(err error) string {
	var e *kclient.Error
	if errors.As(err, &e) {
		return e.Code()
	}
	return ""
}

func kilnStatus(err error) int {
	var e *kclient.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}
