package main

// The cluster's cgroups on a cgroup v1 host (v2 works the same way: one hierarchy): fkc's
// own cgroup is made under the cgroup fkc was started in, in every hierarchy, and every
// process of the cluster runs under it — the components in cgroups of their own, each
// kubelet's pods under its cgroupRoot. Nothing outside it is moved, limited or touched.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const cgroupFS = "/sys/fs/cgroup"

// hierarchy is one mounted cgroup hierarchy: its directory and the controllers it has.
type hierarchy struct {
	Dir         string
	Controllers []string // "cpu", "memory", ..., "name=systemd"; empty for the unified one
	Unified     bool
}

// hierarchies lists the cgroup hierarchies mounted under /sys/fs/cgroup.
func hierarchies() ([]hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var hs []hierarchy
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... mount point (field 5) ... " - " fstype source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		mp := pf[4]
		if !strings.HasPrefix(mp, cgroupFS+"/") && mp != cgroupFS {
			continue
		}
		switch qf[0] {
		case "cgroup2":
			hs = append(hs, hierarchy{Dir: mp, Unified: true})
		case "cgroup":
			var ctrls []string
			for _, o := range strings.Split(qf[2], ",") {
				switch o {
				case "rw", "ro", "relatime", "noexec", "nosuid", "nodev", "clone_children":
				default:
					if !strings.HasPrefix(o, "release_agent=") {
						ctrls = append(ctrls, o)
					}
				}
			}
			hs = append(hs, hierarchy{Dir: mp, Controllers: ctrls})
		}
	}
	return hs, sc.Err()
}

// ownCgroups reads /proc/self/cgroup: the path of this process in each hierarchy, keyed
// by the hierarchy's controller list as the file writes it ("" for cgroup2).
func ownCgroups() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			out[parts[1]] = parts[2]
		}
	}
	return out, nil
}

// cgroupBase chooses fkc's cgroup: the same path in every hierarchy (the kubelet takes one
// cgroupRoot for all of them), nested under this process's cgroup in each. That is the
// deepest of this process's paths, when every other is an ancestor of it; otherwise there
// is no such path and fkc refuses rather than escape its cgroup somewhere.
func cgroupBase(own map[string]string) (string, error) {
	deepest := "/"
	for _, p := range own {
		if len(p) > len(deepest) {
			deepest = p
		}
	}
	for ctrl, p := range own {
		if !isAncestor(p, deepest) {
			return "", fmt.Errorf("this process's cgroups have no common descendant: %q is %s but %s is not below it (cgroup %q)", ctrl, p, deepest, ctrl)
		}
	}
	return filepath.Join(deepest, "fkc"), nil
}

func isAncestor(a, b string) bool {
	a = strings.TrimSuffix(a, "/")
	return a == "" || b == a || strings.HasPrefix(b, a+"/")
}

// makeCgroupBase creates base in every hierarchy, and records the directories it made.
func makeCgroupBase(st *clusterState, base string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		parts := strings.Split(strings.Trim(base, "/"), "/")
		dir := h.Dir
		for _, p := range parts {
			dir = filepath.Join(dir, p)
			if _, err := os.Stat(dir); err == nil {
				continue
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				return fmt.Errorf("creating cgroup %s: %w", dir, err)
			}
			if err := st.record(func(s *clusterState) { s.CgroupDirs = append(s.CgroupDirs, dir) }); err != nil {
				return err
			}
			if err := inheritCpuset(h, dir); err != nil {
				return err
			}
		}
	}
	return nil
}

// inheritCpuset gives a new cgroup of a cpuset hierarchy its parent's CPUs and memory
// nodes: a new cpuset cgroup has none, and no process could run in it.
func inheritCpuset(h hierarchy, dir string) error {
	if !hasController(h, "cpuset") {
		return nil
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
			return fmt.Errorf("setting %s of %s: %w", f, dir, err)
		}
	}
	return nil
}

func hasController(h hierarchy, c string) bool {
	for _, x := range h.Controllers {
		if x == c {
			return true
		}
	}
	return false
}

// pidsDir is the directory of a cgroup under the pids hierarchy (or the unified one): the
// one fkc tracks processes by.
func pidsDir(rel string) (string, error) {
	hs, err := hierarchies()
	if err != nil {
		return "", err
	}
	for _, h := range hs {
		if hasController(h, "pids") {
			return filepath.Join(h.Dir, rel), nil
		}
	}
	for _, h := range hs {
		if h.Unified && len(hs) == 1 {
			return filepath.Join(h.Dir, rel), nil
		}
	}
	return "", fmt.Errorf("no pids cgroup hierarchy is mounted")
}

// cgroupPids lists every process in a cgroup and below it.
func cgroupPids(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
		return nil
	})
	return pids
}

// killCgroup ends every process under a cgroup: SIGKILL, again until none is left (a
// process may fork as it dies), for at most the timeout.
func killCgroup(dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := cgroupPids(dir)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes still in %s after %s: %v", len(pids), dir, timeout, pids)
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeCgroupTree removes base and everything below it in every hierarchy (the
// kubelets' and runc's cgroups among them), deepest first, then the ancestors up made.
func removeCgroupTree(base string, made []string) []error {
	var errs []error
	hs, err := hierarchies()
	if err != nil {
		return []error{err}
	}
	for _, h := range hs {
		root := filepath.Join(h.Dir, base)
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			if err := rmdirRetry(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for i := len(made) - 1; i >= 0; i-- {
		if err := rmdirRetry(made[i]); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errs
}

// rmdirRetry removes a cgroup directory; a cgroup whose last process just died can be
// busy for a moment.
func rmdirRetry(dir string) error {
	var err error
	for range 40 {
		err = syscall.Rmdir(dir)
		if err == nil || os.IsNotExist(err) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}

// procStart is a process's start time in clock ticks since boot, or 0.
func procStart(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); the start time is field 22.
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}
