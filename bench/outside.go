package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-zookeeper/zk"
	goredislib "github.com/redis/go-redis/v9"
)

// An outsider is a server of another coordination system that the lock
// and election benchmarks start beside coordd, each its own process on
// loopback, durable as coordd is (fsync on every write): ZooKeeper 3.8
// standalone, and Redis with appendfsync always. Debian's packages
// (zookeeper, redis-server); `make bench-peers` installs them.
type outsider struct {
	name string
	addr string
	cmd  *exec.Cmd
}

// outsiders are the servers started for this run; nil where the system is
// not installed (its rows are left out, and the bench says so).
var outsiders struct {
	zk    *outsider
	redis *outsider
}

// zooKeeperClasspath is Debian's: the jar names its dependencies.
const zooKeeperClasspath = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"

// startOutsiders starts ZooKeeper and Redis in dir when installed, and
// returns a func that stops them.
func startOutsiders(dir string) (stop func()) {
	var started []*outsider
	if _, err := os.Stat("/usr/share/java/zookeeper.jar"); err != nil {
		fmt.Println("(ZooKeeper is not installed, its rows are left out: make bench-peers installs it)")
	} else if z, err := startZooKeeper(filepath.Join(dir, "zookeeper")); err != nil {
		fmt.Printf("(ZooKeeper did not start, its rows are left out: %v)\n", err)
	} else {
		outsiders.zk = z
		started = append(started, z)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		fmt.Println("(Redis is not installed, its rows are left out: make bench-peers installs it)")
	} else if r, err := startRedis(filepath.Join(dir, "redis")); err != nil {
		fmt.Printf("(Redis did not start, its rows are left out: %v)\n", err)
	} else {
		outsiders.redis = r
		started = append(started, r)
	}
	return func() {
		for _, o := range started {
			_ = o.cmd.Process.Kill() // a bench server; its data goes with dir
			_ = o.cmd.Wait()
		}
	}
}

// startZooKeeper runs a standalone ZooKeeper with its defaults for
// durability (forceSync=yes: every transaction is fsynced before it is
// acknowledged), a tick of 1s (so sessions may be as short as 2s, as
// coordd's), and no limit on connections from one host.
func startZooKeeper(dir string) (*outsider, error) {
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, err
	}
	port := freePort()
	cfg := fmt.Sprintf("tickTime=1000\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\nforceSync=yes\n",
		filepath.Join(dir, "data"), port)
	cfgFile := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "zookeeper.log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }() // the child has its own descriptor
	cmd := exec.Command("java", "-Dzookeeper.root.logger=WARN,CONSOLE", "-cp", zooKeeperClasspath,
		"org.apache.zookeeper.server.ZooKeeperServerMain", cfgFile)
	cmd.Stdout, cmd.Stderr = log, log
	o := &outsider{name: "ZooKeeper", addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// Ready once a session is established.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := zkConnect(o.addr, 10*time.Second)
		if err == nil {
			c.Close()
			return o, nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("no session within 30s (log: %s): %w", log.Name(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startRedis runs redis-server with every write fsynced to its append-only
// file before it is acknowledged (appendfsync always), no snapshots.
func startRedis(dir string) (*outsider, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port := freePort()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no", "--loglevel", "warning")
	o := &outsider{name: "Redis", addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := goredislib.NewClient(&goredislib.Options{Addr: o.addr})
		err := c.Ping(context.Background()).Err()
		_ = c.Close()
		if err == nil {
			return o, nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("no answer to PING within 10s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cpuSeconds is the server's CPU time so far, or -1.
func (o *outsider) cpuSeconds() float64 { return procCPUSeconds(o.cmd.Process.Pid) }

// zkConnect opens a ZooKeeper session (its timeout: sessionTimeout) and
// waits until the server has granted it.
func zkConnect(addr string, sessionTimeout time.Duration) (*zk.Conn, error) {
	c, events, err := zk.Connect([]string{addr}, sessionTimeout, zk.WithLogInfo(false), zk.WithLogger(quietZK{}))
	if err != nil {
		return nil, err
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				return c, nil
			}
		case <-timeout:
			c.Close()
			return nil, errors.New("zookeeper: no session within 10s")
		}
	}
}

// quietZK drops go-zookeeper's log lines.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

// zkLockPeer is go-zookeeper's lock recipe (an ephemeral sequential node
// per waiter, each watching the one before it), one session per client.
func zkLockPeer(o *outsider) lockPeer {
	return lockPeer{name: zkLock, serverCPU: o.cpuSeconds, newClient: func(_ context.Context, name string) (locker, error) {
		c, err := zkConnect(o.addr, 30*time.Second)
		if err != nil {
			return nil, err
		}
		return &zkLocker{c: c, l: zk.NewLock(c, "/bench/zk-lock/"+name, zk.WorldACL(zk.PermAll))}, nil
	}}
}

type zkLocker struct {
	c *zk.Conn
	l *zk.Lock
}

func (l *zkLocker) acquire(context.Context) (func(context.Context) error, error) {
	if err := l.l.Lock(); err != nil {
		return nil, err
	}
	return func(context.Context) error { return l.l.Unlock() }, nil
}

func (l *zkLocker) close() { l.c.Close() }

// redisRetryDelay is how long a redsync waiter sleeps between tries (its
// default, 50-250ms, would make every contended figure a sleep).
const redisRetryDelay = time.Millisecond

// redisLockPeer is redsync (SET NX PX, and a Lua compare-and-delete to
// release) on one Redis; a waiter polls every redisRetryDelay.
func redisLockPeer(o *outsider) lockPeer {
	return lockPeer{name: redisLock, serverCPU: o.cpuSeconds, newClient: func(_ context.Context, name string) (locker, error) {
		c := goredislib.NewClient(&goredislib.Options{Addr: o.addr})
		rs := redsync.New(goredis.NewPool(c))
		m := rs.NewMutex("bench/redis/"+name, redsync.WithExpiry(30*time.Second), redsync.WithTries(math.MaxInt32), redsync.WithRetryDelay(redisRetryDelay))
		return &redisLocker{c: c, m: m}, nil
	}}
}

type redisLocker struct {
	c *goredislib.Client
	m *redsync.Mutex
}

func (l *redisLocker) acquire(ctx context.Context) (func(context.Context) error, error) {
	if err := l.m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		ok, err := l.m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: unlock found the lock taken")
		}
		return err
	}, nil
}

func (l *redisLocker) close() { _ = l.c.Close() }

// zkElector is a leader latch on ZooKeeper, as Curator's LeaderLatch: each
// candidate creates an ephemeral sequential node holding its value, the
// lowest leads, and each other watches the node before its own. Proclaim
// sets the leader's node's value; an observer watches the children and
// the lowest one's value.
type zkElector struct {
	c    *zk.Conn
	path string
	node string
}

// zkLatch names the ZooKeeper election peer.
const zkLatch = "ZooKeeper leader latch"

func zkElectionPeer(o *outsider, name string) electionPeer {
	path := "/bench/zk-election/" + strings.ReplaceAll(name, "/", "_")
	return electionPeer{
		name: zkLatch,
		candidate: func(ttl int) (elector, error) {
			c, err := zkConnect(o.addr, time.Duration(ttl)*time.Second)
			if err != nil {
				return nil, err
			}
			return &zkElector{c: c, path: path}, nil
		},
		observe: func(ctx context.Context, seen func(string)) error {
			c, err := zkConnect(o.addr, 30*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := zkMkdirs(c, path); err != nil {
				return err
			}
			for ctx.Err() == nil {
				children, _, cw, err := c.ChildrenW(path)
				if err != nil {
					return err
				}
				var dw <-chan zk.Event
				if len(children) > 0 {
					slices.SortFunc(children, func(a, b string) int { return zkSeq(a) - zkSeq(b) })
					data, _, w, err := c.GetW(path + "/" + children[0])
					if err == nil {
						seen(string(data))
						dw = w
					}
				}
				select {
				case <-ctx.Done():
				case <-cw:
				case <-dw:
				}
			}
			return nil
		},
		queued: func(context.Context) (int, error) {
			c, err := zkConnect(o.addr, 30*time.Second)
			if err != nil {
				return 0, err
			}
			defer c.Close()
			children, _, err := c.Children(path)
			if errors.Is(err, zk.ErrNoNode) {
				return 0, nil
			}
			return len(children), err
		},
		child: "zk," + o.addr + "," + name,
	}
}

// zkSeq is the sequence number a sequential node's name ends with.
func zkSeq(node string) int {
	n, _ := strconv.Atoi(node[max(0, len(node)-10):])
	return n
}

// zkMkdirs creates path and its parents where missing.
func zkMkdirs(c *zk.Conn, path string) error {
	p := ""
	for _, part := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		p += "/" + part
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

func (e *zkElector) campaign(ctx context.Context, value string) error {
	if err := zkMkdirs(e.c, e.path); err != nil {
		return err
	}
	node, err := e.c.Create(e.path+"/n-", []byte(value), zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		return err
	}
	e.node = node
	mine := zkSeq(node)
	for {
		children, _, err := e.c.Children(e.path)
		if err != nil {
			return err
		}
		prev, prevSeq := "", -1
		for _, ch := range children {
			if s := zkSeq(ch); s < mine && s > prevSeq {
				prev, prevSeq = ch, s
			}
		}
		if prev == "" {
			return nil // the lowest: elected
		}
		ok, _, w, err := e.c.ExistsW(e.path + "/" + prev)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w:
		}
	}
}

func (e *zkElector) proclaim(_ context.Context, value string) error {
	_, err := e.c.Set(e.node, []byte(value), -1)
	return err
}

func (e *zkElector) resign(context.Context) error {
	err := e.c.Delete(e.node, -1)
	e.node = ""
	return err
}

func (e *zkElector) close() { e.c.Close() }
