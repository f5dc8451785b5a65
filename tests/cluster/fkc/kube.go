package main

// The cluster's API, through kubectl with the admin kubeconfig: what an operator runs.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

type kube struct {
	kubectl    string
	kubeconfig string
}

// run runs kubectl; stdin is given when not empty.
func (k kube) run(stdin string, args ...string) (string, error) {
	return k.runTimeout(60*time.Second, stdin, args...)
}

func (k kube) runTimeout(timeout time.Duration, stdin string, args ...string) (string, error) {
	full := append([]string{"--kubeconfig=" + k.kubeconfig, fmt.Sprintf("--request-timeout=%ds", int(timeout.Seconds()))}, args...)
	cmd := exec.Command(k.kubectl, full...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return stdout.String(), nil
	case <-time.After(timeout + 10*time.Second):
		_ = cmd.Process.Kill()
		return stdout.String(), fmt.Errorf("kubectl %s: no answer within %s", strings.Join(args, " "), timeout)
	}
}

func (k kube) apply(manifest string) error {
	_, err := k.run(manifest, "apply", "-f", "-")
	return err
}

// getJSON reads objects as JSON into out.
func (k kube) getJSON(out any, args ...string) error {
	text, err := k.run("", append([]string{"get", "-o", "json"}, args...)...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(text), out)
}

// The few fields of API objects fkc reads.
type objectMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace"`
	Labels            map[string]string `json:"labels"`
	DeletionTimestamp string            `json:"deletionTimestamp"`
	UID               string            `json:"uid"`
	ResourceVersion   string            `json:"resourceVersion"`
}

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type podList struct {
	Items []pod `json:"items"`
}

type pod struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		NodeName    string `json:"nodeName"`
		HostNetwork bool   `json:"hostNetwork"`
	} `json:"spec"`
	Status struct {
		Phase             string                `json:"phase"`
		PodIP             string                `json:"podIP"`
		PodIPs            []struct{ IP string } `json:"podIPs"`
		Conditions        []condition           `json:"conditions"`
		StartTime         string                `json:"startTime"`
		ContainerStatuses []struct {
			Name         string `json:"name"`
			Ready        bool   `json:"ready"`
			RestartCount int    `json:"restartCount"`
			State        map[string]struct {
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"state"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

func (p pod) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// why says what keeps a pod from being ready.
func (p pod) why() string {
	var out []string
	for _, cs := range p.Status.ContainerStatuses {
		for state, s := range cs.State {
			if state != "running" {
				out = append(out, fmt.Sprintf("%s %s %s %s", cs.Name, state, s.Reason, shorten(s.Message, 200)))
			}
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != "True" && c.Message != "" {
			out = append(out, c.Type+": "+shorten(c.Message, 200))
		}
	}
	if len(out) == 0 {
		return p.Status.Phase
	}
	return strings.Join(out, "; ")
}

type nodeList struct {
	Items []struct {
		Metadata objectMeta `json:"metadata"`
		Spec     struct {
			PodCIDRs []string `json:"podCIDRs"`
		} `json:"spec"`
		Status struct {
			Conditions []condition `json:"conditions"`
		} `json:"status"`
	} `json:"items"`
}

// waitPodsReady waits until every pod the selector names (at least min of them) is Ready.
func (k kube) waitPodsReady(timeout time.Duration, what string, min int, args ...string) error {
	return waitFor(timeout, what, func() error {
		var pl podList
		if err := k.getJSON(&pl, append([]string{"pods"}, args...)...); err != nil {
			return err
		}
		if len(pl.Items) < min {
			return fmt.Errorf("%d of %d pods", len(pl.Items), min)
		}
		for _, p := range pl.Items {
			if !p.ready() {
				return fmt.Errorf("pod %s/%s on %s: %s", p.Metadata.Namespace, p.Metadata.Name, p.Spec.NodeName, p.why())
			}
		}
		return nil
	})
}

func (k kube) waitNodesReady(timeout time.Duration, names []string) error {
	return waitFor(timeout, "the nodes", func() error {
		var nl nodeList
		if err := k.getJSON(&nl, "nodes"); err != nil {
			return err
		}
		ready := map[string]string{}
		for _, n := range nl.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == "Ready" {
					ready[n.Metadata.Name] = c.Status + " " + c.Message
				}
			}
		}
		for _, name := range names {
			if !strings.HasPrefix(ready[name], "True") {
				return fmt.Errorf("node %s not Ready: %s", name, ready[name])
			}
		}
		return nil
	})
}
