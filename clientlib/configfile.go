package clientlib

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
)

// The cache file keeps a subscription's last configuration, so an app can
// start while coordd is unreachable. It is JSON, written atomically
// (temporary file, fsync, rename), and carries the etcd cluster's id, the
// revision and a checksum of its content. For a namespace whose newest
// release the app rejected (a Binding refused it), it also keeps the last
// release the app accepted, so that Bind starts from that one after a
// restart instead of failing on the bad one.

type cacheFile struct {
	Format     int                       `json:"format"`
	Cluster    string                    `json:"cluster"`
	Revision   int64                     `json:"revision"`
	Namespaces map[string]cacheNamespace `json:"namespaces"`
	// Accepted holds, for namespaces whose release in Namespaces was
	// rejected, the last release that was accepted.
	Accepted map[string]cacheNamespace `json:"accepted,omitempty"`
	Checksum string                    `json:"checksum"`
}

type cacheNamespace struct {
	Release int64             `json:"release"`
	Gray    int64             `json:"gray,omitempty"`
	Values  map[string]string `json:"values"`
}

func (f *cacheFile) sum() (string, error) {
	body, err := json.Marshal(struct {
		Cluster    string
		Revision   int64
		Namespaces map[string]cacheNamespace
		Accepted   map[string]cacheNamespace `json:",omitempty"` // files without it sum as before
	}{f.Cluster, f.Revision, f.Namespaces, f.Accepted}) // map keys marshal sorted: canonical
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(body)
	return hex.EncodeToString(h[:]), nil
}

// writeCacheFile writes s's namespaces, and for each namespace whose view
// in good differs from s's, that view as the last accepted one.
func writeCacheFile(path string, s *ConfigSnapshot, namespaces []string, good map[string]*nsView) error {
	f := cacheFile{Format: 1, Cluster: s.cluster, Revision: s.revision, Namespaces: map[string]cacheNamespace{}}
	for _, ns := range namespaces {
		v := s.spaces[ns]
		f.Namespaces[ns] = cacheNamespace{Release: v.release, Gray: v.gray, Values: v.values}
		if g := good[ns]; g != nil && g != v {
			if f.Accepted == nil {
				f.Accepted = map[string]cacheNamespace{}
			}
			f.Accepted[ns] = cacheNamespace{Release: g.release, Gray: g.gray, Values: g.values}
		}
	}
	var err error
	if f.Checksum, err = f.sum(); err != nil {
		return err
	}
	data, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	// After a successful rename there is nothing to remove; before it,
	// the error that stopped the write is the one returned.
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable. Windows cannot sync a directory
// (FlushFileBuffers needs write access, which a directory's handle does
// not have), so there it does nothing.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	_ = d.Close() // opened only to sync it: the sync's error is the one that counts
	return err
}

// readCacheFile loads a cache file that covers every namespace asked for
// and whose checksum matches: its snapshot, and the last accepted view of
// every namespace (the snapshot's own, unless it was rejected).
func readCacheFile(path string, namespaces []string) (*ConfigSnapshot, map[string]*nsView, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var f cacheFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, nil, fmt.Errorf("not a coordd cache file: %w", err)
	}
	if f.Format != 1 {
		return nil, nil, fmt.Errorf("cache file format %d is not 1", f.Format)
	}
	sum, err := f.sum()
	if err != nil || sum != f.Checksum {
		return nil, nil, fmt.Errorf("cache file checksum does not match: it is damaged")
	}
	view := func(v cacheNamespace) *nsView {
		if v.Values == nil {
			v.Values = map[string]string{}
		}
		return &nsView{release: v.Release, gray: v.Gray, values: v.Values}
	}
	s := &ConfigSnapshot{revision: f.Revision, cluster: f.Cluster, spaces: map[string]*nsView{}}
	good := map[string]*nsView{}
	for _, ns := range namespaces {
		v, ok := f.Namespaces[ns]
		if !ok {
			return nil, nil, fmt.Errorf("cache file has no namespace %q (it has %v)", ns, slices.Sorted(maps.Keys(f.Namespaces)))
		}
		s.spaces[ns] = view(v)
		good[ns] = s.spaces[ns]
		if a, ok := f.Accepted[ns]; ok {
			good[ns] = view(a)
		}
	}
	return s, good, nil
}
