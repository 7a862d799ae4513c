package central

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"kiln/api"
)

// TestStoreOrderAndResume: a batch moves the cursor with its events in one
// transaction; a replayed or reordered batch is refused (no duplicate);
// a reopened file resumes at the stored cursor.
func TestStoreOrderAndResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.db")
	d, err := openDB(path, false)
	if err != nil {
		t.Fatal(err)
	}
	ev := func(i uint64) api.Event {
		return api.Event{Index: i, Time: time.Unix(int64(i), 0).UTC(), Subject: "machine/m-1", Kind: "transition", To: "available"}
	}
	ev3b := ev(3)
	ev3b.Seq = 1
	if err := d.appendEvents("s", 0, 7, []api.Event{ev(3), ev3b, ev(7)}); err != nil {
		t.Fatal(err)
	}
	if err := d.appendEvents("s", 7, 9, []api.Event{ev(7)}); !errors.Is(err, ErrOrder) {
		t.Fatalf("an index at the cursor again: %v, want ErrOrder", err)
	}
	if err := d.appendEvents("s", 0, 7, []api.Event{ev(3), ev(7)}); !errors.Is(err, ErrOrder) {
		t.Fatalf("replayed batch: %v, want ErrOrder", err)
	}
	if err := d.appendEvents("s", 7, 9, []api.Event{ev(9), ev(8)}); !errors.Is(err, ErrOrder) {
		t.Fatalf("reordered batch: %v, want ErrOrder", err)
	}
	if err := d.appendEvents("s", 7, 12, nil); err != nil { // an empty answer may move the cursor
		t.Fatal(err)
	}
	d.Close()
	d, err = openDB(path, false)
	if err != nil {
		t.Fatal(err)
	}
	c, n, err := d.cursor("s")
	if err != nil || c != 12 || n != 3 {
		t.Fatalf("reopened: cursor %d, %d events, %v; want 12, 3", c, n, err)
	}
	if err := d.appendEvents("s", 12, 13, []api.Event{ev(13)}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	cp, err := ReadCopy(path, "s")
	if err != nil {
		t.Fatal(err)
	}
	if cp.Cursor != 13 || len(cp.Events) != 4 || cp.Events[1].Seq != 1 || cp.Events[3].Index != 13 || !cp.Events[2].Time.Equal(time.Unix(7, 0)) {
		t.Fatalf("copy: cursor %d, events %+v", cp.Cursor, cp.Events)
	}
}
