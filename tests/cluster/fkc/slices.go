package main

// fkc slices: the running flock install switched to PodSlices with Helm (flock-controller
// --pod-slices, the agents --pod-source slices) and checked on the real API server: the
// CRD is accepted, every peer pod of the cluster is in exactly one slice, the writer-only
// admission policy refuses an administrator's create, update and delete, and no agent
// reports the writer absent. The switch runs under upgrade.sh's traffic (streams, new
// connections, UDP, DNS, denied probes between pods on both nodes), whose losses must be 0.
// smoke.sh afterwards runs the cluster's checks with the agents on slices. --off switches
// back to every agent watching every Pod (measured the same way).

import (
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

func cmdSlices(args []string) error {
	fs := flag.NewFlagSet("slices", flag.ContinueOnError)
	off := fs.Bool("off", false, "switch back: agents watch every Pod, no PodSlices are written")
	if err := fs.Parse(args); err != nil {
		return exitCode(2)
	}
	u, err := newUpgrade("slices")
	if err != nil {
		return err
	}
	c := u.s.c
	if err := u.writeValues(); err != nil {
		return err
	}
	// Helm never installs a CRD on upgrade: the new one first, as docs/install.md says.
	if _, err := c.k.run("", "apply", "--server-side", "-f", filepath.Join(c.l.Repo, "deploy/helm/flock/crds")); err != nil {
		return fmt.Errorf("the CRDs: %w", err)
	}
	// Two steps, as docs/install.md says: the writer first (agents still on Pods) until the
	// slices show every peer pod, then the agents — an agent on slices before they exist
	// keeps every other node's pods out of its peer sets (fail closed). Off: the agents
	// back to Pods first, then the writer.
	helm := func(set ...string) error {
		_, err := u.runHelm(append(append([]string{"upgrade", "--install", "flock", filepath.Join(c.l.Repo, "deploy/helm/flock"), "--take-ownership", "--server-side=false"}, u.chartArgs()...), set...)...)
		if err != nil {
			return err
		}
		return u.waitAgentsReady()
	}
	steps := [][]string{
		{"--set", "controller.podSlices.enabled=true", "--set", "agent.podSource=pods"},
		{"--set", "controller.podSlices.enabled=true", "--set", "agent.podSource=slices"},
	}
	if *off {
		steps = [][]string{
			{"--set", "controller.podSlices.enabled=true", "--set", "agent.podSource=pods"},
			{"--set", "controller.podSlices.enabled=false", "--set", "agent.podSource=pods"},
		}
	}
	if err := u.s.setup(); err != nil {
		return fmt.Errorf("setting up the fixture pods: %w", err)
	}
	defer u.s.teardown()
	if err := u.policies(); err != nil {
		return err
	}
	t0 := time.Now()
	var want, got []string
	counts, times, err := u.measure(func() error {
		for i, set := range steps {
			progress("slices: helm upgrade --install %s, under traffic", strings.Join(set, " "))
			if err := helm(set...); err != nil {
				return err
			}
			if i > 0 || *off {
				continue
			}
			// Every peer pod in exactly one slice before any agent reads them.
			deadline := time.Now().Add(90 * time.Second)
			for {
				if want, got, err = sliceMembers(c.k); err != nil {
					return err
				}
				if strings.Join(want, ",") == strings.Join(got, ",") {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the PodSlices show %d pods, the cluster has %d peer pods (shown: %v; peers: %v)", len(got), len(want), got, want)
				}
				time.Sleep(500 * time.Millisecond)
			}
			progress("slices: %d peer pods, each in one PodSlice, %.0f s after the writer's rollout began", len(want), time.Since(t0).Seconds())
		}
		return nil
	})
	if err != nil {
		return err
	}
	summary := fmt.Sprintf("%d streams (%d cut), %d new connections (%d failed), %d UDP (%d lost), %d DNS (%d failed), %d denied probes (%d answered); nodes without a Ready agent: %v",
		counts.Streams, counts.StreamsCut, counts.NewConns, counts.NewConnsFailed, counts.UDP, counts.UDPLost, counts.DNS, counts.DNSFailed, counts.Denied, counts.DeniedAnswer, times)
	progress("slices: rolled out in %.0f s: %s", time.Since(t0).Seconds(), summary)
	if counts.losses() > 0 {
		return fmt.Errorf("the switch lost traffic: %s", summary)
	}
	if *off {
		fmt.Printf("slices: off: agents watch every Pod; the switch: %s\n", summary)
		return nil
	}

	// Still every peer pod, now that the agents (and the fixture's pods) have moved.
	if want, got, err = sliceMembers(c.k); err != nil {
		return err
	}
	if strings.Join(want, ",") != strings.Join(got, ",") {
		return fmt.Errorf("after the switch the PodSlices show %d pods, the cluster has %d peer pods", len(got), len(want))
	}

	// The admission policy: nobody but flock-controller writes a slice.
	forged := `{"apiVersion": "flock.dev/v1alpha1", "kind": "PodSlice", "metadata": {"name": "forged"},
"spec": {"namespace": "default", "labelSets": [{"app": "x"}], "pods": [{"name": "x", "uid": "u", "node": "n", "ips": ["198.18.0.250"], "labels": 0, "phase": "Running"}]}}`
	refused := 0
	for _, try := range []struct {
		what  string
		stdin string
		args  []string
	}{
		{"create", forged, []string{"create", "-f", "-"}},
		{"update", "", []string{"label", "podslice", "--all", "forged-by=admin"}},
		{"delete", "", []string{"delete", "podslice", "--all", "--wait=false"}},
	} {
		out, err := c.k.run(try.stdin, try.args...)
		if err == nil {
			return fmt.Errorf("an administrator's PodSlice %s was admitted: %s", try.what, strings.TrimSpace(out))
		}
		if !strings.Contains(err.Error(), "only flock-controller") {
			return fmt.Errorf("an administrator's PodSlice %s failed, but not by the admission policy: %v", try.what, err)
		}
		refused++
	}
	progress("slices: an administrator's create, update and delete refused by flock-podslice-writer")

	// No agent says the writer is absent.
	out, err := c.k.run("", "get", "pods", "-n", "flock-system", "-l", "app.kubernetes.io/name=flock-agent", "-o", "name")
	if err != nil {
		return err
	}
	pods := strings.Fields(out)
	for _, p := range pods {
		logs, err := c.k.run("", "logs", "-n", "flock-system", p, "-c", "flock-agent")
		if err != nil {
			return err
		}
		if strings.Contains(logs, "PodSlices are not being written") {
			return fmt.Errorf("agent %s reports the PodSlice writer absent", p)
		}
		if !strings.Contains(logs, "every watch finished its initial list") {
			return fmt.Errorf("agent %s has not completed its source", p)
		}
	}
	fmt.Printf("slices: on: %d peer pods in PodSlices, %d writes by others refused, %d agents on slices; the switch: %s\n", len(want), refused, len(pods), summary)
	return nil
}

// sliceMembers: the uids of the cluster's peer pods (scheduled, with addresses, not
// host-networked, not finished) and the uids the PodSlices show, each sorted.
func sliceMembers(k kube) (want, got []string, err error) {
	var pods podList
	if err := k.getJSON(&pods, "pods", "-A"); err != nil {
		return nil, nil, err
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && !p.Spec.HostNetwork && len(p.Status.PodIPs) > 0 && p.Status.Phase != "Succeeded" && p.Status.Phase != "Failed" {
			want = append(want, p.Metadata.UID)
		}
	}
	var slices struct {
		Items []struct {
			Spec struct {
				Pods []struct {
					UID string `json:"uid"`
				} `json:"pods"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := k.getJSON(&slices, "podslices"); err != nil {
		return nil, nil, err
	}
	for _, s := range slices.Items {
		for _, p := range s.Spec.Pods {
			got = append(got, p.UID)
		}
	}
	sort.Strings(want)
	sort.Strings(got)
	return want, got, nil
}
