package main

// flock's images as the repository's Dockerfile describes them, built without a container
// engine: the Dockerfile is read, and each instruction of the stages an image needs is
// carried out here — the build stage's commands on this Debian 12 host (the same glibc as
// the image's bookworm), the final stage's packages by mmdebstrap, its COPY, RUN ln, ENV,
// USER and ENTRYPOINT into the image. An instruction this builder does not know fails the
// build by name, so the Dockerfile and what the cluster runs cannot drift apart unnoticed.

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

type instruction struct {
	Line int
	Op   string // upper case: FROM, RUN, COPY, ...
	Args string
}

type stage struct {
	Name string
	From string
	Ins  []instruction
}

// parseDockerfile splits a Dockerfile into stages; continuation lines are joined, comments
// and blank lines dropped.
func parseDockerfile(text string) ([]stage, error) {
	var stages []stage
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		start := i + 1
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			next := strings.TrimSpace(lines[i])
			if strings.HasPrefix(next, "#") {
				continue
			}
			line = strings.TrimSuffix(line, "\\") + " " + next
		}
		op, args, _ := strings.Cut(line, " ")
		op = strings.ToUpper(op)
		args = strings.Join(strings.Fields(args), " ")
		if op == "FROM" {
			f := strings.Fields(args)
			st := stage{From: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.Name = f[2]
			} else if len(f) != 1 {
				return nil, fmt.Errorf("Dockerfile line %d: cannot read FROM %q", start, args)
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			return nil, fmt.Errorf("Dockerfile line %d: %s before any FROM", start, op)
		}
		s := &stages[len(stages)-1]
		s.Ins = append(s.Ins, instruction{Line: start, Op: op, Args: args})
	}
	return stages, nil
}

func findStage(stages []stage, name string) (*stage, error) {
	for i := range stages {
		if stages[i].Name == name {
			return &stages[i], nil
		}
	}
	return nil, fmt.Errorf("the Dockerfile has no stage %q", name)
}

// buildCommands are the build stage's commands that make the binaries: the RUN lines after
// its last `COPY . .` (before it, cargo-chef only caches dependencies in a layer of its
// own, which a host build does not need). /out is where they write.
func buildCommands(st *stage) ([]string, error) {
	last := -1
	for i, in := range st.Ins {
		if in.Op == "COPY" && in.Args == ". ." {
			last = i
		}
	}
	if last < 0 {
		return nil, fmt.Errorf("stage %s has no `COPY . .`", st.Name)
	}
	var cmds []string
	for _, in := range st.Ins[last+1:] {
		switch in.Op {
		case "RUN":
			cmds = append(cmds, in.Args)
		case "ARG", "ENV", "WORKDIR":
			// ARG FLOCK_COMMIT: given as the environment; WORKDIR is the repository.
		default:
			return nil, fmt.Errorf("Dockerfile line %d: the cluster's image builder cannot do %s in the build stage", in.Line, in.Op)
		}
	}
	return cmds, nil
}

// imagePlan is what a final stage asks for: a Debian root with packages, files copied from
// the build stage's /out, symlinks, and the configuration.
type imagePlan struct {
	Root   debianRoot
	Copies []imageFile // Source relative to /out
	Config imageConfig
}

// debianSuites maps a debian image's tag to its suite.
var debianSuites = map[string]string{"12": "bookworm", "13": "trixie"}

func planImage(st *stage) (*imagePlan, error) {
	img, tag, ok := strings.Cut(st.From, ":")
	if !ok || img != "debian" {
		return nil, fmt.Errorf("stage %s is FROM %s: the cluster's image builder makes only debian bases", st.Name, st.From)
	}
	suite := ""
	if parts := strings.FieldsFunc(tag, func(r rune) bool { return r == '.' || r == '-' }); len(parts) > 0 {
		suite = debianSuites[parts[0]]
	}
	if suite == "" {
		return nil, fmt.Errorf("stage %s: no Debian suite known for %s", st.Name, st.From)
	}
	p := &imagePlan{Root: debianRoot{Suite: suite, Slim: strings.HasSuffix(tag, "-slim")}}
	for _, in := range st.Ins {
		switch in.Op {
		case "RUN":
			if err := p.run(in); err != nil {
				return nil, err
			}
		case "COPY":
			f := strings.Fields(in.Args)
			if len(f) < 3 || f[0] != "--from=build" {
				return nil, fmt.Errorf("Dockerfile line %d: only COPY --from=build is understood, not %q", in.Line, in.Args)
			}
			dest := f[len(f)-1]
			for _, src := range f[1 : len(f)-1] {
				rel, ok := strings.CutPrefix(src, "/out/")
				if !ok {
					return nil, fmt.Errorf("Dockerfile line %d: %s is not under /out", in.Line, src)
				}
				path := dest
				if strings.HasSuffix(dest, "/") {
					path = dest + filepath.Base(rel)
				}
				p.Copies = append(p.Copies, imageFile{Path: path, Source: rel, Mode: 0o755})
			}
		case "ENV":
			k, v, ok := strings.Cut(in.Args, "=")
			if !ok || strings.Contains(in.Args, " ") {
				return nil, fmt.Errorf("Dockerfile line %d: ENV must be one KEY=VALUE", in.Line)
			}
			if p.Config.Env == nil {
				p.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
			}
			p.Config.Env = append(p.Config.Env, k+"="+v)
		case "USER":
			p.Config.User = in.Args
		case "ENTRYPOINT":
			var ep []string
			if err := json.Unmarshal([]byte(in.Args), &ep); err != nil {
				return nil, fmt.Errorf("Dockerfile line %d: ENTRYPOINT must be the exec form: %w", in.Line, err)
			}
			p.Config.Entrypoint = ep
		case "CMD":
			var cmd []string
			if err := json.Unmarshal([]byte(in.Args), &cmd); err != nil {
				return nil, fmt.Errorf("Dockerfile line %d: CMD must be the exec form: %w", in.Line, err)
			}
			p.Config.Cmd = cmd
		default:
			return nil, fmt.Errorf("Dockerfile line %d: the cluster's image builder cannot do %s", in.Line, in.Op)
		}
	}
	return p, nil
}

// run understands the two kinds of RUN a final stage has: installing Debian packages
// (`apt-get update && apt-get install ... PKG... && rm -rf /var/lib/apt/lists/*`) and
// `ln -s TARGET LINK`.
func (p *imagePlan) run(in instruction) error {
	for _, part := range strings.Split(in.Args, "&&") {
		f := strings.Fields(part)
		switch {
		case len(f) >= 2 && f[0] == "apt-get" && f[1] == "update":
		case len(f) >= 2 && f[0] == "rm" && f[1] == "-rf" && len(f) == 3 && f[2] == "/var/lib/apt/lists/*":
			// mmdebstrap leaves no package lists behind.
		case len(f) >= 2 && f[0] == "apt-get" && f[1] == "install":
			for _, w := range f[2:] {
				if !strings.HasPrefix(w, "-") {
					p.Root.Packages = append(p.Root.Packages, w)
				}
			}
		case len(f) == 4 && f[0] == "ln" && f[1] == "-s":
			p.Copies = append(p.Copies, imageFile{Path: f[3], Link: f[2]})
		default:
			return fmt.Errorf("Dockerfile line %d: the cluster's image builder cannot run %q", in.Line, strings.TrimSpace(part))
		}
	}
	return nil
}
