package main

// Where things live: the repository (the working directory), the binary cache, and
// target/cluster (the kubeconfig, logs, the running cluster's state and its nodes' roots).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// interrupted is set by SIGINT/SIGTERM: long waits give up and the command cleans up.
var interrupted atomic.Bool

var errInterrupted = fmt.Errorf("interrupted")

type layout struct {
	Repo      string // the repository's root
	CacheRoot string // ${FLOCK_CLUSTER_CACHE:-/var/cache/flock-cluster}
	Hash      string // of the pins
	Cache     string // CacheRoot/Hash: bin/, images/, stamps/
	Target    string // Repo/target/cluster
	// Commit names what Repo holds when it is not a checkout (upgrade.sh's previous
	// version, extracted from git); empty: Repo's HEAD.
	Commit string
}

func newLayout() (*layout, error) {
	repo, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(repo, "tests/cluster/modules")); err != nil {
		return nil, fmt.Errorf("run fkc from the repository's root (through tests/cluster/*.sh): %w", err)
	}
	root := os.Getenv("FLOCK_CLUSTER_CACHE")
	if root == "" {
		root = "/var/cache/flock-cluster"
	}
	hash, err := pinsHash(filepath.Join(repo, "tests/cluster/modules"))
	if err != nil {
		return nil, err
	}
	return &layout{
		Repo:      repo,
		CacheRoot: root,
		Hash:      hash,
		Cache:     filepath.Join(root, hash),
		Target:    filepath.Join(repo, "target/cluster"),
	}, nil
}

func (l *layout) Modules() string        { return filepath.Join(l.Repo, "tests/cluster/modules") }
func (l *layout) Bin(name string) string { return filepath.Join(l.Cache, "bin", name) }
func (l *layout) Kubeconfig() string     { return filepath.Join(l.Target, "kubeconfig") }
func (l *layout) State() string          { return filepath.Join(l.Target, "state") }
func (l *layout) Logs() string           { return filepath.Join(l.Target, "logs") }
func (l *layout) PKI() string            { return filepath.Join(l.State(), "pki") }

// lock takes the one lock build, up and down share, so that two runs never race on the
// cache or the cluster. It is held until the process exits (the kernel drops it then, also
// after a crash).
func (l *layout) lock(what string) error {
	if err := os.MkdirAll(l.CacheRoot, 0o755); err != nil {
		return err
	}
	path := filepath.Join(l.CacheRoot, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("opening the lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		progress("waiting for the lock %s (held by %s)", path, strings.TrimSpace(string(holder)))
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			return fmt.Errorf("taking the lock %s: %w", path, err)
		}
	}
	_ = f.Truncate(0)
	fmt.Fprintf(f, "fkc %s, pid %d\n", what, os.Getpid())
	// Deliberately never closed: the descriptor holds the lock for the process's life.
	lockFile = f
	return nil
}

var lockFile *os.File

var started = time.Now()

// progress prints one line of progress, with the time since the command started.
func progress(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(started).Seconds(), fmt.Sprintf(format, args...))
}

// run runs a command, its output going to the log file (or discarded); the error names the
// command and carries the output's tail.
func run(log io.Writer, name string, args ...string) error {
	return runEnv(context.Background(), log, nil, name, args...)
}

func runEnv(ctx context.Context, log io.Writer, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var tail tailBuffer
	if log != nil {
		cmd.Stdout = io.MultiWriter(log, &tail)
	} else {
		cmd.Stdout = &tail
	}
	cmd.Stderr = cmd.Stdout
	if env != nil {
		cmd.Env = env
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail.String())
	}
	return nil
}

// output runs a command and returns its standard output; the error carries its standard error.
func output(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// tailBuffer keeps the last 4 KiB written to it: enough of a failing command's output to
// say why, without holding a build's whole log.
type tailBuffer struct{ buf []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = t.buf[len(t.buf)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimRight(string(t.buf), "\n") }

// writeFile writes a file atomically (a temporary file renamed over it): a crash leaves
// the old or the new content, never half of one.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func cmdEnv(args []string) error {
	l, err := newLayout()
	if err != nil {
		return err
	}
	fmt.Printf("FKC_CACHE=%s\nFKC_PINS=%s\nFKC_TARGET=%s\nKUBECONFIG=%s\n", l.Cache, l.Hash, l.Target, l.Kubeconfig())
	return nil
}

func bgCtx() context.Context { return context.Background() }

// outputIn is output with a working directory.
func outputIn(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s (in %s): %w: %s", name, strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func jsonUnmarshal(text string, out any) error { return json.Unmarshal([]byte(text), out) }

func execCommand(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }

func numCPU() int { return runtime.NumCPU() }
