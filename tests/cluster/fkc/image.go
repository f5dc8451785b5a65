package main

// Images without a registry and without a container engine: a Debian root made by
// mmdebstrap (from Debian's archive, the only place packages come from), a layer of
// binaries, written as a docker-archive tarball that `ctr images import` loads under its
// exact name. No layer is pulled from anywhere.

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// debianRoot describes a Debian root file system: the suite and the packages on top of
// minbase. Slim drops documentation, man pages and locales, as Debian's -slim images do.
type debianRoot struct {
	Suite    string
	Packages []string
	Slim     bool
	// Hooks are shell commands run in the finished root (mmdebstrap's customize hooks,
	// "$1" the root's path): users and groups an image needs.
	Hooks []string
}

func (r debianRoot) key() string {
	pk := append([]string(nil), r.Packages...)
	sort.Strings(pk)
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s %v %s %s", r.Suite, r.Slim, strings.Join(pk, ","), strings.Join(r.Hooks, "\n"))))
	return r.Suite + "-" + hex.EncodeToString(sum[:])[:12]
}

// Debian's archive, as this machine's apt sources name it.
var debianMirrors = []string{
	"deb http://deb.debian.org/debian %s main",
	"deb http://deb.debian.org/debian %s-updates main",
	"deb http://deb.debian.org/debian-security %s-security main",
}

// rootfs returns the path of the root's tarball under dir, making it with mmdebstrap when
// it is not there yet.
func (r debianRoot) rootfs(dir string, log io.Writer) (string, error) {
	path := filepath.Join(dir, "debian-"+r.key()+".tar")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	args := []string{"--variant=minbase", "--mode=root", "--quiet"}
	if len(r.Packages) > 0 {
		args = append(args, "--include="+strings.Join(r.Packages, ","))
	}
	if r.Slim {
		for _, p := range []string{"/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*"} {
			args = append(args, "--dpkgopt=path-exclude="+p)
		}
		args = append(args, "--dpkgopt=path-include=/usr/share/doc/*/copyright")
	}
	for _, h := range r.Hooks {
		args = append(args, "--customize-hook="+h)
	}
	tmp := path + ".tmp.tar"
	args = append(args, r.Suite, tmp)
	for _, m := range debianMirrors {
		args = append(args, fmt.Sprintf(m, r.Suite))
	}
	// A fixed time: the same packages give the same tarball's file times.
	env := append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	if err := runEnv(bgCtx(), log, env, "mmdebstrap", args...); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("making the Debian %s root (%s): %w", r.Suite, strings.Join(r.Packages, " "), err)
	}
	return path, os.Rename(tmp, path)
}

// imageFile is a file of a layer built here.
type imageFile struct {
	Path   string // in the image, absolute
	Source string // on the host; empty for a symlink or a literal
	Data   []byte // literal content when Source is empty and Link is empty
	Link   string // symlink target
	Mode   int64
}

// layerTar writes a layer of the given files (and their parent directories) to path; every
// time and owner is fixed, so equal files give an equal layer.
func layerTar(path string, files []imageFile) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	epoch := time.Unix(1700000000, 0)
	dirs := map[string]bool{}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, file := range files {
		rel := strings.TrimPrefix(file.Path, "/")
		// Parent directories first, once each.
		parts := strings.Split(rel, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		if strings.HasSuffix(rel, "/") {
			// A directory: made above with its parents.
			continue
		}
		hdr := &tar.Header{Name: rel, Mode: file.Mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case file.Link != "":
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = file.Link
			hdr.Mode = 0o777
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case file.Source != "":
			src, err := os.Open(file.Source)
			if err != nil {
				return err
			}
			st, err := src.Stat()
			if err != nil {
				src.Close()
				return err
			}
			hdr.Typeflag = tar.TypeReg
			hdr.Size = st.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				src.Close()
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				return err
			}
		default:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(file.Data))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(file.Data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// imageConfig is the part of an OCI image configuration a container's start reads.
type imageConfig struct {
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	Env        []string `json:"Env,omitempty"`
	User       string   `json:"User,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
	StopSignal string   `json:"StopSignal,omitempty"`
}

// writeImage writes a docker-archive (the format `docker save` writes and `ctr images
// import` reads) holding the layers, bottom first, under every name in tags.
func writeImage(out string, tags []string, layers []string, cfg imageConfig) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	epoch := time.Unix(1700000000, 0)
	var diffIDs, layerNames []string
	for _, layer := range layers {
		sum, size, err := fileDigest(layer)
		if err != nil {
			return err
		}
		name := sum + ".tar"
		diffIDs = append(diffIDs, "sha256:"+sum)
		layerNames = append(layerNames, name)
		src, err := os.Open(layer)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			src.Close()
			return err
		}
		_, err = io.Copy(tw, src)
		src.Close()
		if err != nil {
			return err
		}
	}
	if cfg.Env == nil {
		cfg.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	config := map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": diffIDs},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(configJSON)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	if err := writeTarFile(tw, configName, configJSON, epoch); err != nil {
		return err
	}
	manifest := []map[string]any{{"Config": configName, "RepoTags": tags, "Layers": layerNames}}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	if err := writeTarFile(tw, "manifest.json", manifestJSON, epoch); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}

func writeTarFile(tw *tar.Writer, name string, data []byte, t time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: t, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func fileDigest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// The test images' names: exactly what the e2e framework and network-policy-api ask for,
// so that nothing ever has to be pulled.
const (
	agnhostImage = "registry.k8s.io/e2e-test-images/agnhost:" + agnhostVersion
	corednsImage = "registry.k8s.io/coredns/coredns:" + corednsVersion
)

// agnhostRoot is agnhost's base: upstream's image is Alpine with bash, curl, netcat,
// iproute2, DNS tools, iperf, socat and util-linux, and the user and group some tests run
// as; this is Debian with the same.
var agnhostRoot = debianRoot{Suite: "bookworm", Slim: true,
	Packages: []string{"bash", "curl", "netcat-openbsd", "iproute2", "dnsutils", "iputils-ping", "ca-certificates", "iperf", "socat"},
	Hooks: []string{
		`chroot "$1" groupadd -g 50000 group-defined-in-image`,
		`chroot "$1" useradd -u 1000 -M -G group-defined-in-image user-defined-in-image`,
	}}

// agnhostFiles is what upstream's agnhost image adds to its base: the binary (also as
// agnhost-2), porter's TLS certificate and key (its SERVE_TLS_PORT_ listeners read them),
// CoreDNS (its DNS tests serve with /coredns), /uploads (netexec's upload directory).
func (l *layout) agnhostFiles() ([]imageFile, error) {
	dir, err := moduleDir(filepath.Join(l.Modules(), "kubernetes"), "k8s.io/kubernetes@"+kubernetesVersion)
	if err != nil {
		return nil, err
	}
	porter := filepath.Join(dir, "test/images/agnhost/porter")
	return []imageFile{
		{Path: "/agnhost", Source: l.Bin("agnhost"), Mode: 0o755},
		{Path: "/agnhost-2", Link: "agnhost"},
		{Path: "/localhost.crt", Source: filepath.Join(porter, "localhost.crt"), Mode: 0o644},
		{Path: "/localhost.key", Source: filepath.Join(porter, "localhost.key"), Mode: 0o644},
		{Path: "/coredns", Source: l.Bin("coredns"), Mode: 0o755},
		{Path: "/uploads/", Mode: 0o755},
	}, nil
}

// buildBaseImages writes the images made only of pinned binaries into the cache:
// agnhost (also every node's sandbox image: `agnhost pause` is its default command) and
// CoreDNS.
func (l *layout) buildBaseImages() error {
	dir := filepath.Join(l.Cache, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(l.Cache, "logs", "images.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()

	agnhostTar := filepath.Join(dir, "agnhost.tar")
	if _, err := os.Stat(agnhostTar); err != nil {
		t := time.Now()
		root, err := agnhostRoot.rootfs(filepath.Join(l.CacheRoot, "rootfs"), log)
		if err != nil {
			return err
		}
		files, err := l.agnhostFiles()
		if err != nil {
			return err
		}
		layer := filepath.Join(dir, "agnhost-layer.tar")
		if err := layerTar(layer, files); err != nil {
			return err
		}
		if err := writeImage(agnhostTar, []string{agnhostImage}, []string{root, layer},
			imageConfig{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}); err != nil {
			return err
		}
		_ = os.Remove(layer)
		progress("image: %s built in %.0f s", agnhostImage, time.Since(t).Seconds())
	} else {
		progress("image: %-48s cached", agnhostImage)
	}

	corednsTar := filepath.Join(dir, "coredns.tar")
	if _, err := os.Stat(corednsTar); err != nil {
		layer := filepath.Join(dir, "coredns-layer.tar")
		// Like upstream's image: the binary alone (it needs no shell or libc).
		if err := layerTar(layer, []imageFile{
			{Path: "/coredns", Source: l.Bin("coredns"), Mode: 0o755},
			{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/:/coredns\nnonroot:x:65532:65532:nonroot:/:/coredns\n"), Mode: 0o644},
		}); err != nil {
			return err
		}
		if err := writeImage(corednsTar, []string{corednsImage}, []string{layer},
			imageConfig{Entrypoint: []string{"/coredns"}, User: "65532:65532"}); err != nil {
			return err
		}
		_ = os.Remove(layer)
		progress("image: %s built", corednsImage)
	} else {
		progress("image: %-48s cached", corednsImage)
	}
	return nil
}

// agnhost245Image is the tag network-policy-api v0.3.0's conformance manifests name.
const agnhost245Image = "registry.k8s.io/e2e-test-images/agnhost:2.45"

// agnhostNoSCTPWrapper is /agnhost of the agnhost:2.45 image network-policy-api's suite
// runs: the real agnhost (this release's, at /agnhost-real) behind an entrypoint that, where
// the kernel has no SCTP, drops only the SCTP port variables `porter` reads (porter exits
// when it cannot listen on one, and no pod of the suite would start). Everything else — every
// other command, every TCP and UDP port — is the real agnhost, unchanged.
const agnhostNoSCTPWrapper = `#!/bin/bash
# flock's real cluster (tests/cluster): this kernel may lack SCTP (see docs/cluster.md).
if [ "$1" = porter ] && [ ! -d /proc/net/sctp ]; then
  for v in $(compgen -e); do
    case "$v" in SERVE_SCTP_PORT_*) unset "$v" ;; esac
  done
fi
exec /agnhost-real "$@"
`

// e2eImage is an image the upstream suites name, built here from Debian and this
// release's binaries (what upstream's Dockerfile installs, from Debian's archive).
type e2eImage struct {
	File  string // under images/
	Tag   string
	Root  debianRoot
	Files []imageFile
	Conf  imageConfig
	What  string
}

func (l *layout) e2eImages() ([]e2eImage, error) {
	slim := func(pkgs ...string) debianRoot { return debianRoot{Suite: "bookworm", Slim: true, Packages: pkgs} }
	agnhost, err := l.agnhostFiles()
	if err != nil {
		return nil, err
	}
	var wrapped []imageFile
	for _, f := range agnhost {
		if f.Path == "/agnhost" {
			f.Path = "/agnhost-real"
		}
		wrapped = append(wrapped, f)
	}
	wrapped = append(wrapped, imageFile{Path: "/agnhost", Data: []byte(agnhostNoSCTPWrapper), Mode: 0o755})
	return []e2eImage{
		{File: "agnhost-2.45.tar", Tag: agnhost245Image, Root: agnhostRoot,
			Files: wrapped,
			Conf:  imageConfig{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
			What:  "agnhost " + agnhostVersion + ", SCTP port variables dropped where the kernel lacks SCTP (network-policy-api's suite)"},
		// Upstream: debian:bookworm-slim with dnsutils and a CoreDNS binary at /coredns.
		{File: "glibc-dns-testing.tar", Tag: "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1", Root: slim("dnsutils"),
			Files: []imageFile{{Path: "/coredns", Source: l.Bin("coredns"), Mode: 0o755}},
			Conf:  imageConfig{Cmd: []string{"bash"}},
			What:  "Debian bookworm with dnsutils and CoreDNS " + corednsVersion},
		// Upstream: nginx 1.27 on Alpine; here Debian's nginx, serving its default page on 80.
		{File: "nginx.tar", Tag: "registry.k8s.io/e2e-test-images/nginx:1.27.0-2", Root: slim("nginx"),
			Conf: imageConfig{Cmd: []string{"nginx", "-g", "daemon off;"}, StopSignal: "SIGQUIT"},
			What: "Debian bookworm's nginx"},
		// The e2e framework's pause image: agnhost's pause, as the nodes' sandboxes run it.
		{File: "pause.tar", Tag: "registry.k8s.io/pause:3.10.2", Root: agnhostRoot,
			Files: []imageFile{{Path: "/agnhost", Source: l.Bin("agnhost"), Mode: 0o755}, {Path: "/pause", Link: "agnhost"}},
			Conf:  imageConfig{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
			What:  "agnhost pause"},
	}, nil
}

// buildE2EImages writes the images only the upstream suites need.
func (l *layout) buildE2EImages() ([]string, error) {
	dir := filepath.Join(l.Cache, "images")
	log, err := os.OpenFile(filepath.Join(l.Cache, "logs", "images.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	images, err := l.e2eImages()
	if err != nil {
		return nil, err
	}
	var tars []string
	for _, img := range images {
		out := filepath.Join(dir, img.File)
		tars = append(tars, out)
		if _, err := os.Stat(out); err == nil {
			progress("image: %-48s cached", img.Tag)
			continue
		}
		root, err := img.Root.rootfs(filepath.Join(l.CacheRoot, "rootfs"), log)
		if err != nil {
			return nil, err
		}
		layers := []string{root}
		if len(img.Files) > 0 {
			layer := out + ".layer"
			if err := layerTar(layer, img.Files); err != nil {
				return nil, err
			}
			defer os.Remove(layer)
			layers = append(layers, layer)
		}
		if err := writeImage(out, []string{img.Tag}, layers, img.Conf); err != nil {
			return nil, err
		}
		progress("image: %s (%s)", img.Tag, img.What)
	}
	return tars, nil
}
