// Package rotate is an append-only file that rotates by size: past
// MaxBytes, file becomes file.1 (file.1 becomes file.2, ...), keeping
// Keep old files. It starts no goroutine: rotation happens in Write.
package rotate

import (
	"fmt"
	"os"
	"sync"
)

// File is a size-rotated file. It is safe for concurrent use; each Write
// lands whole in one file.
type File struct {
	path     string
	maxBytes int64
	keep     int

	mu   sync.Mutex
	f    *os.File
	size int64
}

// Open opens (or creates) path for appending.
func Open(path string, maxBytes int64, keep int) (*File, error) {
	if maxBytes <= 0 || keep < 0 {
		return nil, fmt.Errorf("rotate: %s: the size limit must be positive and the files kept not negative", path)
	}
	r := &File{path: path, maxBytes: maxBytes, keep: keep}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *File) open() error {
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close() // the Stat error is the one to report
		return err
	}
	r.f, r.size = f, st.Size()
	return nil
}

// Write appends p, rotating first if p would take the file past its limit.
func (r *File) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return 0, os.ErrClosed
	}
	if r.size > 0 && r.size+int64(len(p)) > r.maxBytes {
		if err := r.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

// rotate shifts the old files up by one, dropping the oldest, and starts
// an empty file.
func (r *File) rotate() error {
	if err := r.f.Close(); err != nil {
		return err
	}
	r.f = nil
	name := func(i int) string { return fmt.Sprintf("%s.%d", r.path, i) }
	if r.keep == 0 {
		if err := os.Remove(r.path); err != nil && !os.IsNotExist(err) {
			return err
		}
	} else {
		_ = os.Remove(name(r.keep)) // may not exist yet
		for i := r.keep - 1; i >= 1; i-- {
			if err := os.Rename(name(i), name(i+1)); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
		if err := os.Rename(r.path, name(1)); err != nil {
			return err
		}
	}
	return r.open()
}

// Close closes the file; later writes fail.
func (r *File) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}
