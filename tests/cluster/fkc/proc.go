package main

// The cluster's processes: each component starts in a cgroup of its own under fkc's
// (tracked in the pids hierarchy), entering its node's network, mount and UTS namespaces
// with nsenter, its output in target/cluster/logs/<name>.log. A process is recorded with
// its start time, so that a pid reused after a crash is never signalled.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// component is how to (re)start one process of the cluster.
type component struct {
	Name string   `json:"name"`
	Node string   `json:"node,omitempty"` // "" for the control plane (the root namespaces)
	Bin  string   `json:"bin"`
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
}

// nodeNS are the namespace files of a node.
type nodeNS struct {
	Net, Mount, UTS string
}

func (c *cluster) nodeNS(node string) nodeNS {
	return nodeNS{
		Net:   "/run/netns/fkc-" + node,
		Mount: filepath.Join(c.l.State(), "ns", node+".mnt"),
		UTS:   filepath.Join(c.l.State(), "ns", node+".uts"),
	}
}

// nsenterArgs is the nsenter prefix that runs a command in a node.
func (c *cluster) nsenterArgs(node string) []string {
	ns := c.nodeNS(node)
	return []string{"nsenter", "--net=" + ns.Net, "--mount=" + ns.Mount, "--uts=" + ns.UTS, "--wd=/", "--"}
}

// startComponent starts a process and records it.
func (c *cluster) startComponent(comp component) error {
	if interrupted.Load() {
		return errInterrupted
	}
	cg := filepath.Join(c.st.CgroupBase, "proc", comp.Name)
	dir, err := pidsDir(cg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(c.l.Logs(), comp.Name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "==== %s: %s %s\n", time.Now().Format(time.RFC3339), comp.Bin, strings.Join(comp.Args, " "))
	// The shell joins the cgroup and becomes the component: the pid recorded is the
	// component's own.
	argv := []string{"-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(dir, "cgroup.procs")}
	if comp.Node != "" {
		argv = append(argv, c.nsenterArgs(comp.Node)...)
	}
	argv = append(argv, comp.Bin)
	argv = append(argv, comp.Args...)
	cmd := exec.Command("/bin/sh", argv...)
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.Env = append([]string{"PATH=" + c.l.Bin("") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}, comp.Env...)
	// Its own session: the terminal's Ctrl-C reaches fkc, which cleans up, not the cluster.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", comp.Name, err)
	}
	pid := cmd.Process.Pid
	// Reap it when it exits while fkc runs (a crash shows in its log and in the waits).
	go func() { _ = cmd.Wait() }()
	c.compMu.Lock()
	c.comps[comp.Name] = comp
	c.compMu.Unlock()
	return c.st.record(func(s *clusterState) {
		s.Processes[comp.Name] = process{Pid: pid, Cgroup: cg, Log: logPath, Start: procStart(pid), Node: comp.Node}
		s.Components = append(removeComponent(s.Components, comp.Name), comp)
	})
}

func removeComponent(list []component, name string) []component {
	var out []component
	for _, c := range list {
		if c.Name != name {
			out = append(out, c)
		}
	}
	return out
}

// alive says whether the recorded process is still the one fkc started.
func alive(p process) bool {
	if p.Pid <= 0 {
		return false
	}
	if err := syscall.Kill(p.Pid, 0); err != nil {
		return false
	}
	return p.Start == 0 || procStart(p.Pid) == p.Start
}

// stopComponent ends a component: SIGTERM, then SIGKILL to everything left in its cgroup
// after the grace period.
func (c *cluster) stopComponent(name string, grace time.Duration) error {
	c.st.mu.Lock()
	p, ok := c.st.Processes[name]
	c.st.mu.Unlock()
	if !ok {
		return fmt.Errorf("no component %s was started", name)
	}
	dir, err := pidsDir(p.Cgroup)
	if err != nil {
		return err
	}
	if alive(p) {
		_ = syscall.Kill(p.Pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) && len(cgroupPids(dir)) > 0 {
		time.Sleep(50 * time.Millisecond)
	}
	return killCgroup(dir, 10*time.Second)
}

// restartComponent stops a component and starts it again as it was started.
func (c *cluster) restartComponent(name string, grace time.Duration) error {
	c.compMu.Lock()
	comp, ok := c.comps[name]
	c.compMu.Unlock()
	if !ok {
		return fmt.Errorf("no component %s was started", name)
	}
	if err := c.stopComponent(name, grace); err != nil {
		return err
	}
	return c.startComponent(comp)
}
