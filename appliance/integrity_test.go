package appliance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"kiln/store"
)

// availableMachine creates a machine and walks it to available through the
// store (legal transitions only), as an inspection that passed would.
func availableMachine(t *testing.T, st *store.Store, name, mac string) store.Machine {
	t.Helper()
	ctx := context.Background()
	w := store.W{Actor: "test"}
	m, err := st.PutMachine(ctx, store.Machine{Name: name, Intended: store.Hardware{NICs: []store.NIC{{MAC: mac}}}}, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []store.MachineState{store.StateInspecting, store.StateAvailable} {
		m.State = s
		if m, err = st.PutMachine(ctx, m, w); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// TestImageDeleteRacesProvision: DELETE /v1/images/{id} racing POST
// /v1/machines/{id}/provision naming that image, over real HTTP against the
// embedded default. Never may both succeed, and no machine may end with a
// claim naming a missing image (issue 20: both succeeded in 7 of 10 runs).
func TestImageDeleteRacesProvision(t *testing.T) {
	n := startNode(t, DefaultNodeID, nil)
	n.waitReady(t)
	api := "http://" + n.cfg.API.Addr
	st := n.app.Store
	const runs = 50
	type pair struct {
		img  string
		mach string
	}
	pairs := make([]pair, runs)
	for i := range pairs {
		data := fmt.Sprintf("image %02d\n", i)
		sum := sha256.Sum256([]byte(data))
		q := url.Values{"name": {fmt.Sprintf("race-%02d.raw", i)}, "version": {"1"}, "sha256": {hex.EncodeToString(sum[:])}}
		code, body := httpDo(t, n.token, http.MethodPost, api+"/v1/images?"+q.Encode(), "application/octet-stream",
			strings.NewReader(data))
		if code != http.StatusCreated {
			t.Fatalf("upload: %d %s", code, body)
		}
		var im store.Image
		if err := json.Unmarshal(body, &im); err != nil {
			t.Fatal(err)
		}
		m := availableMachine(t, st, fmt.Sprintf("race-%02d", i), fmt.Sprintf("02:00:00:00:2a:%02x", i))
		pairs[i] = pair{img: im.ID, mach: m.ID}
	}

	type outcome struct {
		del, prov         int
		delBody, provBody []byte
	}
	out := make([]outcome, runs)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range pairs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			out[i].del, out[i].delBody = httpDo(t, n.token, http.MethodDelete, api+"/v1/images/"+p.img, "application/json", nil)
		}()
		go func() {
			defer wg.Done()
			<-start
			body := fmt.Sprintf(`{"claim":{"image":%q}}`, p.img)
			out[i].prov, out[i].provBody = httpDo(t, n.token, http.MethodPost, api+"/v1/machines/"+p.mach+"/provision",
				"application/json", strings.NewReader(body))
		}()
	}
	close(start)
	wg.Wait()

	both, dels, provs := 0, 0, 0
	for i, p := range pairs {
		o := out[i]
		delOK, provOK := o.del == http.StatusNoContent, o.prov == http.StatusAccepted
		if delOK {
			dels++
		}
		if provOK {
			provs++
		}
		if delOK && provOK {
			both++
		}
		// Each loser is refused as a client error naming why, never a 500.
		if !delOK && (o.del != http.StatusConflict || errCode(o.delBody) != "image_in_use") {
			t.Errorf("run %d: DELETE answered %d %s, want 204 or 409 image_in_use", i, o.del, o.delBody)
		}
		if !provOK && (o.prov != http.StatusBadRequest || !strings.Contains(string(o.provBody), "claim.image: no image")) {
			t.Errorf("run %d: provision answered %d %s, want 202 or 400 naming claim.image", i, o.prov, o.provBody)
		}
		m, err := st.GetMachine(p.mach)
		if err != nil {
			t.Fatal(err)
		}
		if m.Claim != nil {
			if _, err := st.GetImage(m.Claim.Image); err != nil {
				t.Errorf("run %d: machine %s (%s) claims image %s, which is gone: %v", i, m.ID, m.State, m.Claim.Image, err)
			}
		}
	}
	t.Logf("%d runs: %d deletes and %d provisions succeeded, both in %d", runs, dels, provs, both)
	if both > 0 {
		t.Errorf("delete and provision both succeeded in %d of %d runs", both, runs)
	}
	if dels+provs != runs {
		t.Errorf("%d runs, %d successes: exactly one of each pair must win", runs, dels+provs)
	}
}

// errCode is the "code" of an API error body ("" if it is none).
func errCode(body []byte) string {
	var eb struct {
		Error struct{ Code string }
	}
	_ = json.Unmarshal(body, &eb)
	return eb.Error.Code
}
