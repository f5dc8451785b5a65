// Command fkc is flock's real-cluster tool: it builds pinned Kubernetes components from the
// Go module proxy into a cache, starts a cluster of them on this machine (the control plane in
// the root network namespace, each node a network and mount namespace of its own), installs
// flock as docs/install.md tells users to, checks it, measures it and removes it all again.
//
// tests/cluster/{build,up,down,smoke,bench}.sh are thin entry points: they build this program
// into target/cluster/fkc and run it from the repository's root.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `fkc: flock's real Kubernetes cluster on this machine

  fkc build [--e2e]                     fill the binary cache (e2e.test and ginkgo with --e2e)
  fkc up [--nodes N] [--family ipv4|ipv6|dual] [--cni flock|ptp]
                                        start a cluster (builds what is missing)
  fkc down                              remove everything up made (also after a crash)
  fkc smoke [--only REGEX]              the named checks against the running cluster
  fkc bench [--pods N]                  timings and memory, as JSON
  fkc e2e [--suite netpol|api|conformance|all] [--focus REGEX]
                                        the upstream suites on the running cluster
  fkc restart COMPONENT                 restart one component of the running cluster
  fkc upgrade [--from COMMIT]           adopt, upgrade, roll back and uninstall flock with Helm
                                        under traffic; the last line is JSON
  fkc slices [--off]                    switch the running install to PodSlices (--off: back to
                                        watching Pods) with Helm, and check them
  fkc env                               the paths and pins, for scripts
  fkc cached                            exit 0 when the binary cache is filled

Environment: FLOCK_CLUSTER_CACHE (default /var/cache/flock-cluster).
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	// A signal cancels the work; every command cleans up what it owns on the way out.
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-stop
		interrupted.Store(true)
		// A second signal ends at once.
		<-stop
		os.Exit(130)
	}()
	var err error
	switch cmd {
	case "build":
		err = cmdBuild(args)
	case "up":
		err = cmdUp(args)
	case "down":
		err = cmdDown(args)
	case "smoke":
		err = cmdSmoke(args)
	case "e2e":
		err = cmdE2E(args)
	case "bench":
		err = cmdBench(args)
	case "env":
		err = cmdEnv(args)
	case "cached":
		err = cmdCached(args)
	case "restart":
		err = cmdRestart(args)
	case "upgrade":
		err = cmdUpgrade(args)
	case "slices":
		err = cmdSlices(args)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "fkc: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		var exit exitCode
		if errors.As(err, &exit) {
			os.Exit(int(exit))
		}
		fmt.Fprintf(os.Stderr, "fkc %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

// exitCode ends the program with a status and no further message (the command printed its
// own summary).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
