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
// revision and a checksum of its content.

type cacheFile struct {
	Format     int                       `json:"format"`
	Cluster    string                    `json:"cluster"`
	Revision   int64                     `json:"revision"`
	Namespaces map[string]cacheNamespace `json:"namespaces"`
	Checksum   string                    `json:"checksum"`
}

type cacheNamespace struct {
	Release int64             `json:"release"`
	Values  map[string]string `json:"values"`
}

func (f *cacheFile) sum() (string, error) {
	body, err := json.Marshal(struct {
		Cluster    string
		Revision   int64
		Namespaces map[string]cacheNamespace
	}{f.Cluster, f.Revision, f.Namespaces}) // map keys marshal sorted: canonical
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(body)
	return hex.EncodeToString(h[:]), nil
}

func writeCacheFile(path string, s *ConfigSnapshot, namespaces []string) error {
	f := cacheFile{Format: 1, Cluster: s.cluster, Revision: s.revision, Namespaces: map[string]cacheNamespace{}}
	for _, ns := range namespaces {
		v := s.spaces[ns]
		f.Namespaces[ns] = cacheNamespace{Release: v.release, Values: v.values}
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
// and whose checksum matches.
func readCacheFile(path string, namespaces []string) (*ConfigSnapshot, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f cacheFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a coordd cache file: %w", err)
	}
	if f.Format != 1 {
		return nil, fmt.Errorf("cache file format %d is not 1", f.Format)
	}
	sum, err := f.sum()
	if err != nil || sum != f.Checksum {
		return nil, fmt.Errorf("cache file checksum does not match: it is damaged")
	}
	s := &ConfigSnapshot{revision: f.Revision, cluster: f.Cluster, spaces: map[string]*nsView{}}
	for _, ns := range namespaces {
		v, ok := f.Namespaces[ns]
		if !ok {
			return nil, fmt.Errorf("cache file has no namespace %q (it has %v)", ns, slices.Sorted(maps.Keys(f.Namespaces)))
		}
		if v.Values == nil {
			v.Values = map[string]string{}
		}
		s.spaces[ns] = &nsView{release: v.Release, values: v.Values}
	}
	return s, nil
}
