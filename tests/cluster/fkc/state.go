package main

// What up made, recorded as it is made (target/cluster/state/state.json, rewritten
// atomically after each step), so that down removes exactly that — also after a crash of
// up itself or of the machine's session. Processes are found by their cgroups (every
// process of the cluster runs under fkc's own cgroup), never by name.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

type clusterState struct {
	Nodes  int    `json:"nodes"`
	Family string `json:"family"`
	CNI    string `json:"cni"`
	// CgroupBase is fkc's cgroup, the same path in every hierarchy: the cgroup fkc was
	// started in, plus /fkc.
	CgroupBase string `json:"cgroupBase"`
	// CgroupDirs are the cgroup directories up created (ancestors of CgroupBase that did
	// not exist in some hierarchy among them), removed deepest first.
	CgroupDirs []string `json:"cgroupDirs"`
	// Processes are the components, by name: pid and the cgroup (pids hierarchy) each runs in.
	Processes map[string]process `json:"processes"`
	// Components are how each process was started: the fault checks restart them.
	Components []component `json:"components"`
	NetNS      []string    `json:"netns"`
	// Links are the links made in the root network namespace.
	Links []string `json:"links"`
	// Routes are `ip route` arguments added in the root network namespace.
	Routes [][]string `json:"routes"`
	// Mounts are host mount points fkc made (deepest last); down unmounts them in reverse.
	Mounts []string `json:"mounts"`
	// Dirs are empty directories made on the host's file system as mount points (e.g.
	// /var/lib/kubelet inside the nodes' mount namespaces), removed when empty.
	Dirs []string `json:"dirs"`
	// Sysctls are the host's values before the cluster, of every key the components change.
	Sysctls map[string]string `json:"sysctls"`
	// SysctlSnapshot is the file holding every writable host sysctl before the cluster.
	SysctlSnapshot string `json:"sysctlSnapshot"`
	// Ready is set when up finished.
	Ready bool `json:"ready"`

	path string
	mu   sync.Mutex
}

type process struct {
	Pid    int    `json:"pid"`
	Cgroup string `json:"cgroup"`
	Log    string `json:"log"`
	// Start is the process's start time in clock ticks (/proc/PID/stat field 22): a pid
	// reused by another process after a crash is not taken for it.
	Start uint64 `json:"start"`
	// Node is the node it belongs to ("" for the control plane).
	Node string `json:"node,omitempty"`
}

func statePath(l *layout) string { return filepath.Join(l.State(), "state.json") }

func loadState(l *layout) (*clusterState, error) {
	data, err := os.ReadFile(statePath(l))
	if err != nil {
		return nil, err
	}
	s := &clusterState{}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("reading %s: %w", statePath(l), err)
	}
	s.path = statePath(l)
	if s.Processes == nil {
		s.Processes = map[string]process{}
	}
	return s, nil
}

func newState(l *layout) *clusterState {
	return &clusterState{path: statePath(l), Processes: map[string]process{}, Sysctls: map[string]string{}}
}

// save writes the state; called after every recorded step.
func (s *clusterState) save() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(s.path, data, 0o600)
}

func (s *clusterState) record(f func(*clusterState)) error {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
	return s.save()
}
