package httpboot

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// digestCache computes a file's SHA-256 once per (path, size, mtime) and
// remembers it; concurrent first requests for one file share one computation.
type digestCache struct {
	mu      sync.Mutex
	entries map[string]*digestEntry
	observe func(time.Duration)
}

type digestEntry struct {
	size  int64
	mtime time.Time
	done  chan struct{}
	sum   string
	err   error
}

func newDigestCache(observe func(time.Duration)) *digestCache {
	return &digestCache{entries: map[string]*digestEntry{}, observe: observe}
}

// get returns the lower-case hex SHA-256 of the file at path, whose current
// size and mtime are given (from the caller's Stat of its open file).
func (c *digestCache) get(path string, size int64, mtime time.Time) (string, error) {
	c.mu.Lock()
	e, ok := c.entries[path]
	if !ok || e.size != size || !e.mtime.Equal(mtime) {
		e = &digestEntry{size: size, mtime: mtime, done: make(chan struct{})}
		c.entries[path] = e
		c.mu.Unlock()
		start := time.Now()
		e.sum, e.err = hashFile(path)
		if c.observe != nil {
			c.observe(time.Since(start))
		}
		close(e.done)
		if e.err != nil {
			c.mu.Lock()
			if c.entries[path] == e {
				delete(c.entries, path)
			}
			c.mu.Unlock()
		}
		return e.sum, e.err
	}
	c.mu.Unlock()
	<-e.done
	return e.sum, e.err
}

// put seeds the cache (after an upload that hashed the bytes as it wrote them).
func (c *digestCache) put(path string, size int64, mtime time.Time, sum string) {
	e := &digestEntry{size: size, mtime: mtime, done: make(chan struct{}), sum: sum}
	close(e.done)
	c.mu.Lock()
	c.entries[path] = e
	c.mu.Unlock()
}

func (c *digestCache) forget(path string) {
	c.mu.Lock()
	delete(c.entries, path)
	c.mu.Unlock()
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 1<<20)); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
