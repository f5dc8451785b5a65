package main

// down: removes everything up recorded — processes (by their cgroups), mounts, network
// namespaces, links, cgroups, mount points, files — and restores the host's sysctls; it is
// safe after a crash of up or of the cluster, and a second run finds nothing to do.

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

func cmdDown(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("down takes no arguments")
	}
	l, err := newLayout()
	if err != nil {
		return err
	}
	if err := l.lock("down"); err != nil {
		return err
	}
	return l.down()
}

func (l *layout) down() error {
	st, err := loadState(l)
	if errors.Is(err, os.ErrNotExist) {
		st = newState(l)
		progress("down: no cluster recorded; looking for leftovers by fkc's names")
	} else if err != nil {
		return err
	}
	var errs []error
	t := time.Now()

	// 1. Processes: the components first, gently (kubelets and kube-proxies, then the
	// runtimes, then the control plane), then everything left under fkc's cgroup.
	order := func(name string) int {
		switch {
		case strings.HasSuffix(name, "-kubelet"), strings.HasSuffix(name, "-kube-proxy"):
			return 0
		case strings.HasSuffix(name, "-containerd"):
			return 1
		case name == "etcd":
			return 3
		}
		return 2
	}
	var names []string
	for name := range st.Processes {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool { return order(names[i]) < order(names[j]) })
	for _, name := range names {
		if p := st.Processes[name]; alive(p) {
			_ = syscall.Kill(p.Pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, name := range names {
		p := st.Processes[name]
		for alive(p) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	killed := 0
	if st.CgroupBase != "" {
		dir, err := pidsDir(st.CgroupBase)
		if err == nil {
			killed = len(cgroupPids(dir))
			if err := killCgroup(dir, 30*time.Second); err != nil {
				errs = append(errs, err)
			}
		} else {
			errs = append(errs, err)
		}
	}
	progress("down: %d components stopped, %d processes left under the cgroup killed", len(names), killed)

	// 2. Mounts: every mount under the state directory (the nodes' namespace files,
	// anything a crash left bound there), deepest first, then the recorded ones.
	mounts := mountsUnder(l.State())
	mounts = append(mounts, st.Mounts...)
	unmounted := 0
	seen := map[string]bool{}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if seen[m] {
			continue
		}
		seen[m] = true
		for isMountPoint(m) {
			if err := syscall.Unmount(m, 0); err != nil {
				if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
					errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
					break
				}
			}
			unmounted++
		}
	}
	progress("down: %d mounts removed", unmounted)

	// 3. Network namespaces (the nodes' nft tables, routes and pods' links go with them)
	// and the root namespace's links (their routes with them).
	netns := append([]string(nil), st.NetNS...)
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "fkc-") {
				netns = append(netns, e.Name())
			}
		}
	}
	removedNS := 0
	seen = map[string]bool{}
	for i := len(netns) - 1; i >= 0; i-- {
		ns := netns[i]
		if seen[ns] {
			continue
		}
		seen[ns] = true
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err != nil {
			continue
		}
		if err := ipCmd("netns", "del", ns); err != nil {
			errs = append(errs, err)
			continue
		}
		removedNS++
	}
	links := append([]string(nil), st.Links...)
	links = append(links, hostLink)
	removedLinks := 0
	seen = map[string]bool{}
	for _, link := range links {
		if seen[link] {
			continue
		}
		seen[link] = true
		if _, err := os.Stat("/sys/class/net/" + link); err != nil {
			continue
		}
		if err := ipCmd("link", "del", link); err != nil {
			errs = append(errs, err)
			continue
		}
		removedLinks++
	}
	progress("down: %d network namespaces and %d links removed", removedNS, removedLinks)

	// 4. cgroups: fkc's tree in every hierarchy (the kubelets' and runc's below it).
	if st.CgroupBase != "" {
		errs = append(errs, removeCgroupTree(st.CgroupBase, st.CgroupDirs)...)
		progress("down: cgroups under %s removed", st.CgroupBase)
	}

	// 5. The host's sysctls.
	restored, serrs := restoreSysctls(st)
	errs = append(errs, serrs...)
	if len(restored) > 0 {
		progress("down: host sysctls restored: %s", strings.Join(restored, "; "))
	}

	// 6. Files: the state directory (the nodes' roots: containerd's images and snapshots,
	// kubelet's pods), never across a mount; then the mount points made on the host.
	if left := mountsUnder(l.State()); len(left) > 0 {
		errs = append(errs, fmt.Errorf("mounts still under %s, files kept: %s", l.State(), strings.Join(left, " ")))
	} else {
		if err := removeTree(l.State()); err != nil {
			errs = append(errs, err)
		}
		progress("down: %s removed", l.State())
		_ = os.Remove(l.Kubeconfig())
	}
	for i := len(st.Dirs) - 1; i >= 0; i-- {
		if err := os.Remove(st.Dirs[i]); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("removing the mount point %s: %w", st.Dirs[i], err))
		}
	}

	// What is left, checked: nothing of fkc's may remain.
	errs = append(errs, leftovers(l, st)...)
	if len(errs) > 0 {
		for _, e := range errs {
			progress("down: %v", e)
		}
		return fmt.Errorf("%d things could not be removed (listed above)", len(errs))
	}
	progress("down: done in %.1f s; nothing of the cluster is left (logs kept in %s)", time.Since(t).Seconds(), l.Logs())
	return nil
}

// leftovers checks that nothing fkc makes is still there.
func leftovers(l *layout, st *clusterState) []error {
	var errs []error
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "fkc-") {
				errs = append(errs, fmt.Errorf("network namespace %s is still there", e.Name()))
			}
		}
	}
	if _, err := os.Stat("/sys/class/net/" + hostLink); err == nil {
		errs = append(errs, fmt.Errorf("link %s is still there", hostLink))
	}
	if st.CgroupBase != "" {
		if hs, err := hierarchies(); err == nil {
			for _, h := range hs {
				if _, err := os.Stat(filepath.Join(h.Dir, st.CgroupBase)); err == nil {
					errs = append(errs, fmt.Errorf("cgroup %s is still there", filepath.Join(h.Dir, st.CgroupBase)))
				}
			}
		}
	}
	if _, err := os.Stat(l.State()); err == nil {
		errs = append(errs, fmt.Errorf("%s is still there", l.State()))
	}
	return errs
}

// mountsUnder lists the mount points at or below dir, from this process's mount table.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

func isMountPoint(path string) bool {
	for _, m := range mountsUnder(path) {
		if m == path {
			return true
		}
	}
	return false
}

// removeTree removes a directory tree without crossing into another file system (a bind
// mount left behind must never lead rm into the host's files).
func removeTree(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	return run(nil, "rm", "-rf", "--one-file-system", "--", dir)
}
