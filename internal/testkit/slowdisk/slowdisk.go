// Package slowdisk makes a slow disk a test can switch on and off: a
// directory mounted through FUSE (github.com/hanwen/go-fuse) that passes
// every operation to a backing directory and delays each fsync and
// fdatasync by an adjustable amount, as a failing or throttled disk would.
// It is for tests, never for production.
//
// The file system is served by the test process: only another process
// (a coordd member started as a process) may use it. A process that both
// serves and uses it can deadlock (a page fault on a file of the mount
// waits for the server's goroutines while the Go runtime stops the world).
//
// It needs FUSE: /dev/fuse and the right to mount (root, or fusermount).
// Mount reports an error when either is missing; tests then skip what
// needs it.
package slowdisk

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Disk is one mounted directory with an adjustable fsync delay.
type Disk struct {
	// Dir is where the file system is mounted.
	Dir   string
	delay atomic.Int64 // nanoseconds added to each fsync
	srv   *fuse.Server
}

// Mount mounts a slow disk at mountpoint over backing (both existing
// directories), with no delay yet, and unmounts it when the test ends.
func Mount(tb testing.TB, backing, mountpoint string) (*Disk, error) {
	d := &Disk{Dir: mountpoint}
	loop, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, err
	}
	root := &node{LoopbackNode: loop.(*fs.LoopbackNode), disk: d}
	srv, err := fs.Mount(mountpoint, root, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMount: true, FsName: "slowdisk", Name: "slowdisk", DisableXAttrs: true,
	}})
	if err != nil {
		return nil, fmt.Errorf("slowdisk: mount %s: %w", mountpoint, err)
	}
	d.srv = srv
	tb.Cleanup(func() {
		d.SetFsyncDelay(0)
		if err := srv.Unmount(); err != nil {
			tb.Logf("slowdisk: unmount %s: %v", mountpoint, err)
		}
	})
	return d, nil
}

// Available reports whether this machine has FUSE (/dev/fuse).
func Available() bool {
	_, err := os.Stat("/dev/fuse")
	return err == nil
}

// SetFsyncDelay makes each fsync and fdatasync from now on take d longer.
func (d *Disk) SetFsyncDelay(delay time.Duration) { d.delay.Store(int64(delay)) }

// node is a loopback node whose files are slow to sync; its children
// (found, created) are such nodes too.
type node struct {
	*fs.LoopbackNode
	disk *Disk
}

var (
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeCreater     = (*node)(nil)
	_ fs.NodeWrapChilder = (*node)(nil)
)

func (n *node) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if lb, ok := ops.(*fs.LoopbackNode); ok {
		return &node{LoopbackNode: lb, disk: n.disk}
	}
	return ops
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fl, errno
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return in, n.wrap(fh), fl, errno
}

func (n *node) wrap(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &file{LoopbackFile: lf, disk: n.disk}
	}
	return fh
}

// file is a loopback file whose Fsync waits the disk's delay first.
type file struct {
	*fs.LoopbackFile
	disk *Disk
}

var _ fs.FileFsyncer = (*file)(nil)

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if d := time.Duration(f.disk.delay.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return f.LoopbackFile.Fsync(ctx, flags)
}
