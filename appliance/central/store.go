package central

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"kiln/api"
)

// The central's copy, one bbolt file:
//
//	bucket "site/NAME/events": key = the event's raft index (8 bytes, big
//	                           endian) then its Seq (4 bytes, big endian),
//	                           value = the api.Event as JSON
//	bucket "site/NAME/meta":   "cursor" (8 bytes BE): the last index held;
//	                           "status": the last api.SiteStatus as JSON;
//	                           "resyncs": JSON []Resync (410 answers)
//
// One raft index may carry several events (one command's, told apart by
// Seq), and the site never splits an index across pages (store.Events), so
// the cursor is an index. Each batch of events and the cursor move in one
// bbolt transaction, so a restart resumes exactly after the last event
// stored: no gap, no duplicate.

// ErrOrder refuses a batch whose indexes are not strictly increasing after
// the stored cursor (a duplicate or a reordering the feed must never send).
var ErrOrder = errors.New("central: events out of order or duplicated")

// Resync records one 410 cursor_expired: the events after From up to To
// (the site's oldest_cursor) were no longer kept; the site status at that
// moment was stored instead.
type Resync struct {
	Time time.Time `json:"time"`
	From uint64    `json:"from"`
	To   uint64    `json:"to"`
}

type db struct{ b *bolt.DB }

func openDB(path string, readOnly bool) (*db, error) {
	b, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, ReadOnly: readOnly})
	if err != nil {
		return nil, fmt.Errorf("central: open %s: %w", path, err)
	}
	return &db{b: b}, nil
}

func (d *db) Close() error { return d.b.Close() }

func evBucket(site string) []byte   { return []byte("site/" + site + "/events") }
func metaBucket(site string) []byte { return []byte("site/" + site + "/meta") }

func be(n uint64) []byte { var k [8]byte; binary.BigEndian.PutUint64(k[:], n); return k[:] }

func evKey(e api.Event) []byte {
	var k [12]byte
	binary.BigEndian.PutUint64(k[:8], e.Index)
	binary.BigEndian.PutUint32(k[8:], uint32(e.Seq))
	return k[:]
}

// cursor is the last index stored for site (0: none).
func (d *db) cursor(site string) (uint64, int, error) {
	var c uint64
	var n int
	err := d.b.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(metaBucket(site)); m != nil {
			if v := m.Get([]byte("cursor")); len(v) == 8 {
				c = binary.BigEndian.Uint64(v)
			}
		}
		if e := tx.Bucket(evBucket(site)); e != nil {
			n = e.Stats().KeyN
		}
		return nil
	})
	return c, n, err
}

// appendEvents stores evs after cursor and moves the cursor to next, in
// one transaction. evs must be strictly increasing and above cursor.
func (d *db) appendEvents(site string, cursor, next uint64, evs []api.Event) error {
	return d.b.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucketIfNotExists(metaBucket(site))
		if err != nil {
			return err
		}
		e, err := tx.CreateBucketIfNotExists(evBucket(site))
		if err != nil {
			return err
		}
		var cur uint64
		if v := m.Get([]byte("cursor")); len(v) == 8 {
			cur = binary.BigEndian.Uint64(v)
		}
		if cur != cursor {
			return fmt.Errorf("%w: site %s: stored cursor %d, batch after %d", ErrOrder, site, cur, cursor)
		}
		last, lastSeq := cursor, -1
		for i, ev := range evs {
			if ev.Index <= cursor || ev.Seq < 0 || (i > 0 && (ev.Index < last || ev.Index == last && ev.Seq <= lastSeq)) {
				return fmt.Errorf("%w: site %s: event %d.%d after cursor %d, previous %d.%d", ErrOrder, site, ev.Index, ev.Seq, cursor, last, lastSeq)
			}
			if e.Get(evKey(ev)) != nil {
				return fmt.Errorf("%w: site %s: event %d.%d already held", ErrOrder, site, ev.Index, ev.Seq)
			}
			js, err := json.Marshal(ev)
			if err != nil {
				return err
			}
			if err := e.Put(evKey(ev), js); err != nil {
				return err
			}
			last, lastSeq = ev.Index, ev.Seq
		}
		if next < last {
			next = last
		}
		return m.Put([]byte("cursor"), be(next))
	})
}

func (d *db) putStatus(site string, st api.SiteStatus) error {
	js, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return d.b.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucketIfNotExists(metaBucket(site))
		if err != nil {
			return err
		}
		return m.Put([]byte("status"), js)
	})
}

// resync stores st as the site's state, records the gap and moves the
// cursor to oldest (one transaction).
func (d *db) resync(site string, from, oldest uint64, st api.SiteStatus) error {
	js, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return d.b.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucketIfNotExists(metaBucket(site))
		if err != nil {
			return err
		}
		var rs []Resync
		if v := m.Get([]byte("resyncs")); v != nil {
			_ = json.Unmarshal(v, &rs)
		}
		rs = append(rs, Resync{Time: time.Now().UTC(), From: from, To: oldest})
		rj, _ := json.Marshal(rs)
		if err := m.Put([]byte("resyncs"), rj); err != nil {
			return err
		}
		if err := m.Put([]byte("status"), js); err != nil {
			return err
		}
		return m.Put([]byte("cursor"), be(max(from, oldest)))
	})
}

// Copy is what the central holds of one site (ReadCopy).
type Copy struct {
	Cursor  uint64
	Events  []api.Event
	Status  *api.SiteStatus
	Resyncs []Resync
}

// ReadCopy opens the state file at path read-only (the puller must not
// hold it) and returns what it holds of site.
func ReadCopy(path, site string) (Copy, error) {
	d, err := openDB(path, true)
	if err != nil {
		return Copy{}, err
	}
	defer d.Close()
	var c Copy
	err = d.b.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(metaBucket(site)); m != nil {
			if v := m.Get([]byte("cursor")); len(v) == 8 {
				c.Cursor = binary.BigEndian.Uint64(v)
			}
			if v := m.Get([]byte("status")); v != nil {
				c.Status = &api.SiteStatus{}
				if err := json.Unmarshal(v, c.Status); err != nil {
					return err
				}
			}
			if v := m.Get([]byte("resyncs")); v != nil {
				if err := json.Unmarshal(v, &c.Resyncs); err != nil {
					return err
				}
			}
		}
		e := tx.Bucket(evBucket(site))
		if e == nil {
			return nil
		}
		return e.ForEach(func(k, v []byte) error {
			var ev api.Event
			if err := json.Unmarshal(v, &ev); err != nil {
				return fmt.Errorf("central: site %s event %x: %w", site, k, err)
			}
			c.Events = append(c.Events, ev)
			return nil
		})
	})
	return c, err
}
