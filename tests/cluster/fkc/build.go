package main

// build: the pinned binaries, built once from the Go module proxy into the cache, and the
// images that come from them alone (agnhost, CoreDNS). Nothing is fetched from anywhere but
// the Go module proxy and Debian's archive.

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The Debian packages the cluster needs on the host: runc (the OCI runtime, Debian's),
// mmdebstrap (the images' base), and the tools the scripts call.
var debianPackages = map[string]string{
	"runc":       "/usr/sbin/runc",
	"mmdebstrap": "/usr/bin/mmdebstrap",
	"nftables":   "/usr/sbin/nft",
	"iproute2":   "/usr/bin/ip",
	"util-linux": "/usr/bin/nsenter",
	"conntrack":  "/usr/sbin/conntrack",
	"kmod":       "/usr/bin/kmod",
	"procps":     "/usr/sbin/sysctl",
}

func ensureDebianPackages() error {
	var missing []string
	for pkg, file := range debianPackages {
		if _, err := os.Stat(file); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	progress("installing Debian packages: %s", strings.Join(missing, " "))
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if err := runEnv(bgCtx(), nil, env, "apt-get", "update", "-qq"); err != nil {
		return err
	}
	args := append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)
	return runEnv(bgCtx(), nil, env, "apt-get", args...)
}

// stamp records how a cached binary was built; a binary is reused only when its stamp
// matches the recipe.
type stamp struct {
	Name    string  `json:"name"`
	Recipe  string  `json:"recipe"`
	Module  string  `json:"module"`
	Package string  `json:"package"`
	Version string  `json:"version"`
	Go      string  `json:"go"`
	Seconds float64 `json:"seconds"`
	Built   string  `json:"built"`
}

func (l *layout) stampPath(name string) string { return filepath.Join(l.Cache, "stamps", name+".json") }

func (l *layout) cached(b binary) bool {
	data, err := os.ReadFile(l.stampPath(b.Name))
	if err != nil {
		return false
	}
	var s stamp
	if json.Unmarshal(data, &s) != nil {
		return false
	}
	if _, err := os.Stat(l.Bin(b.Name)); err != nil {
		return false
	}
	return s.Recipe == b.recipe() && s.Go == runtime.Version()
}

func cmdBuild(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	e2e := fs.Bool("e2e", false, "also build e2e.test and the ginkgo CLI")
	if err := fs.Parse(args); err != nil {
		return exitCode(2)
	}
	l, err := newLayout()
	if err != nil {
		return err
	}
	if err := l.lock("build"); err != nil {
		return err
	}
	sets := []string{"cluster"}
	if *e2e {
		sets = append(sets, "e2e")
	}
	return l.build(sets...)
}

// build fills the cache with every binary of the given sets and the images made of them;
// it takes the caller's lock.
func (l *layout) build(sets ...string) error {
	if err := ensureDebianPackages(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(l.Cache, "bin"), 0o755); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, s := range sets {
		want[s] = true
	}
	begin := time.Now()
	built := 0
	for _, b := range binaries() {
		if !want[b.Set] {
			continue
		}
		if interrupted.Load() {
			return errInterrupted
		}
		if l.cached(b) {
			progress("build: %-24s %-10s cached", b.Name, b.Version)
			continue
		}
		t := time.Now()
		if err := l.buildOne(b); err != nil {
			return err
		}
		built++
		progress("build: %-24s %-10s built in %.0f s", b.Name, b.Version, time.Since(t).Seconds())
	}
	// runc is Debian's: the cache names it beside the others.
	if err := symlink("/usr/sbin/runc", l.Bin("runc")); err != nil {
		return err
	}
	if err := l.exposeBin(); err != nil {
		return err
	}
	if want["cluster"] {
		if err := l.buildBaseImages(); err != nil {
			return err
		}
	}
	if built > 0 {
		progress("build: %d binaries built in %.0f s (cache %s)", built, time.Since(begin).Seconds(), l.Cache)
	} else {
		progress("build: everything cached (%s)", l.Cache)
	}
	return l.writeVersions()
}

func (l *layout) buildOne(b binary) error {
	logPath := filepath.Join(l.Cache, "logs", "build-"+b.Name+".log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	out := l.Bin(b.Name) + ".tmp"
	ldflags := "-s -w"
	for _, x := range b.Stamp {
		ldflags += " -X " + x
	}
	var args []string
	if b.Test {
		args = []string{"test", "-c", "-trimpath", "-ldflags", ldflags, "-o", out, b.Package}
	} else {
		args = []string{"build", "-trimpath", "-ldflags", ldflags, "-o", out, b.Package}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(l.Modules(), b.Module)
	// Static binaries (no cgo: the nodes' images have no matching libc for them to need),
	// this machine's Go, modules only from the proxy and as go.sum pins them.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	cmd.Stdout = log
	cmd.Stderr = log
	t := time.Now()
	if err := cmd.Run(); err != nil {
		tail, _ := os.ReadFile(logPath)
		if len(tail) > 3000 {
			tail = tail[len(tail)-3000:]
		}
		return fmt.Errorf("building %s (%s in modules/%s): %w\n%s\n(whole log: %s)", b.Name, b.Package, b.Module, err, tail, logPath)
	}
	if err := os.Rename(out, l.Bin(b.Name)); err != nil {
		return err
	}
	s := stamp{Name: b.Name, Recipe: b.recipe(), Module: b.Module, Package: b.Package, Version: b.Version, Go: runtime.Version(),
		Seconds: time.Since(t).Seconds(), Built: time.Now().UTC().Format(time.RFC3339)}
	data, _ := json.MarshalIndent(s, "", "  ")
	return writeFile(l.stampPath(b.Name), data, 0o644)
}

// exposeBin points target/cluster/bin at the cache's bin directory.
func (l *layout) exposeBin() error {
	if err := os.MkdirAll(l.Target, 0o755); err != nil {
		return err
	}
	return symlink(filepath.Join(l.Cache, "bin"), filepath.Join(l.Target, "bin"))
}

func symlink(target, link string) error {
	if cur, err := os.Readlink(link); err == nil && cur == target {
		return nil
	}
	_ = os.Remove(link)
	return os.Symlink(target, link)
}

// writeVersions writes VERSIONS in the cache: every binary and what it was built from.
func (l *layout) writeVersions() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# flock's real cluster, pins %s, built with %s\n", l.Hash, runtime.Version())
	for _, bin := range binaries() {
		if l.cached(bin) {
			fmt.Fprintf(&b, "%-24s %-12s %s (modules/%s)\n", bin.Name, bin.Version, bin.Package, bin.Module)
		}
	}
	fmt.Fprintf(&b, "%-24s %-12s %s\n", "runc", debianVersion("runc"), "Debian's package")
	return writeFile(filepath.Join(l.Cache, "VERSIONS"), []byte(b.String()), 0o644)
}

func debianVersion(pkg string) string {
	out, err := output("dpkg-query", "-W", "-f=${Version}", pkg)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(out)
}

// cmdCached says whether every binary of the cluster and its base images are in the cache
// (CI runs the cluster only then).
func cmdCached(args []string) error {
	l, err := newLayout()
	if err != nil {
		return err
	}
	for _, b := range binaries() {
		if b.Set == "cluster" && !l.cached(b) {
			return fmt.Errorf("%s is not in the cache %s", b.Name, l.Cache)
		}
	}
	for _, img := range []string{"agnhost.tar", "coredns.tar"} {
		if _, err := os.Stat(filepath.Join(l.Cache, "images", img)); err != nil {
			return fmt.Errorf("image %s is not in the cache %s", img, l.Cache)
		}
	}
	fmt.Println(l.Cache)
	return nil
}
