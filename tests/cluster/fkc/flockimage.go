package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// flockImage is one of flock's images, built from the checkout.
type flockImage struct {
	Stage string // the Dockerfile's stage
	Name  string // the repository the manifests name
	Tag   string // dev-<hash of its layer>: a new build is a new tag, so a rollout follows it
	Tar   string
}

// The images deploy/ names, by stage.
var flockImageNames = map[string]string{
	"agent":      "ghcr.io/flock-cni/flock",
	"controller": "ghcr.io/flock-cni/flock-controller",
}

func (i flockImage) Ref() string { return i.Name + ":" + i.Tag }

// buildFlockImages builds flock's binaries as the Dockerfile's build stage does, and the
// agent and controller images from its final stages.
func (l *layout) buildFlockImages() ([]flockImage, error) {
	text, err := os.ReadFile(filepath.Join(l.Repo, "Dockerfile"))
	if err != nil {
		return nil, err
	}
	stages, err := parseDockerfile(string(text))
	if err != nil {
		return nil, err
	}
	build, err := findStage(stages, "build")
	if err != nil {
		return nil, err
	}
	cmds, err := buildCommands(build)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(l.Target, "images")
	out := filepath.Join(dir, "out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	// The commit flock_build_info reports, "-dirty" when what the binaries are built from
	// has uncommitted changes (only those paths: a changed test or doc rebuilds nothing).
	commit := l.Commit
	if commit == "" {
		commit, _ = output("git", "rev-parse", "--short", "HEAD")
		if dirty, _ := output("git", "status", "--porcelain", "--untracked-files=no", "--", "src", "cni-plugin", "Cargo.toml", "Cargo.lock", "build.rs"); strings.TrimSpace(dirty) != "" {
			commit = strings.TrimSpace(commit) + "-dirty"
		}
	}
	env := append(os.Environ(), "FLOCK_COMMIT="+strings.TrimSpace(commit))
	logPath := filepath.Join(l.Logs(), "flock-build.log")
	for _, c := range cmds {
		if !strings.Contains(c, " /out") {
			return nil, fmt.Errorf("the build stage's command does not write to /out: %s", c)
		}
		c = strings.ReplaceAll(c, " /out", " "+out)
		progress("flock: %s", shorten(c, 110))
		t := time.Now()
		if err := runHeartbeat(logPath, env, l.Repo, "sh", "-c", c); err != nil {
			return nil, err
		}
		progress("flock: built in %.0f s", time.Since(t).Seconds())
	}
	var images []flockImage
	for _, name := range []string{"agent", "controller"} {
		st, err := findStage(stages, name)
		if err != nil {
			return nil, err
		}
		plan, err := planImage(st)
		if err != nil {
			return nil, err
		}
		img, err := l.writeFlockImage(name, plan, out, dir)
		if err != nil {
			return nil, err
		}
		images = append(images, img)
	}
	return images, nil
}

func (l *layout) writeFlockImage(stageName string, plan *imagePlan, out, dir string) (flockImage, error) {
	log, err := os.OpenFile(filepath.Join(l.Logs(), "images.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return flockImage{}, err
	}
	defer log.Close()
	t := time.Now()
	root, err := plan.Root.rootfs(filepath.Join(l.CacheRoot, "rootfs"), log)
	if err != nil {
		return flockImage{}, err
	}
	var files []imageFile
	for _, c := range plan.Copies {
		if c.Source != "" {
			c.Source = filepath.Join(out, c.Source)
		}
		files = append(files, c)
	}
	layer := filepath.Join(dir, stageName+"-layer.tar")
	if err := layerTar(layer, files); err != nil {
		return flockImage{}, err
	}
	sum, _, err := fileDigest(layer)
	if err != nil {
		return flockImage{}, err
	}
	// The tag names the whole image: the binaries' layer, the Debian root's packages and the
	// configuration. An image of this tag already written is this image.
	cfg, _ := json.Marshal(plan.Config)
	id := sha256.Sum256([]byte(sum + " " + plan.Root.key() + " " + string(cfg)))
	img := flockImage{Stage: stageName, Name: flockImageNames[stageName], Tag: "dev-" + hex.EncodeToString(id[:])[:12]}
	img.Tar = filepath.Join(dir, stageName+"-"+img.Tag+".tar")
	if _, err := os.Stat(img.Tar); err == nil {
		progress("image: %s (stage %s) unchanged", img.Ref(), stageName)
		return img, nil
	}
	old, _ := filepath.Glob(filepath.Join(dir, stageName+"-dev-*.tar"))
	for _, o := range old {
		_ = os.Remove(o)
	}
	if err := writeImage(img.Tar, []string{img.Ref()}, []string{root, layer}, plan.Config); err != nil {
		return flockImage{}, err
	}
	progress("image: %s (stage %s, %s) in %.0f s", img.Ref(), stageName, strings.Join(plan.Root.Packages, " "), time.Since(t).Seconds())
	return img, nil
}

// runHeartbeat runs a long command with its output in a log, printing a line a minute
// with the last thing it said.
func runHeartbeat(logPath string, env []string, dir string, name string, args ...string) error {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout = pw
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		pw.Close()
		pr.Close()
		return err
	}
	pw.Close()
	last := make(chan string, 1)
	done := make(chan struct{})
	var tail tailBuffer
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, line)
			fmt.Fprintln(&tail, line)
			select {
			case <-last:
			default:
			}
			last <- line
		}
	}()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	wait := make(chan error, 1)
	go func() { <-done; wait <- cmd.Wait() }()
	for {
		select {
		case err := <-wait:
			pr.Close()
			if err != nil {
				return fmt.Errorf("%s: %w\n%s\n(whole log: %s)", name, err, tail.String(), logPath)
			}
			return nil
		case <-tick.C:
			select {
			case line := <-last:
				progress("  … %s", shorten(strings.TrimSpace(line), 100))
			default:
				progress("  … (working)")
			}
		}
	}
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
