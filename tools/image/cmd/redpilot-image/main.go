// Command redpilot-image builds the operator's OCI image without a container
// engine: the binary, the shared libraries it loads (found from its ELF
// headers, taken from this machine's Debian packages), CA certificates and
// the passwd and group entries of the nonroot user (UID 65532). The result is
// reproducible: the same inputs give the same digest (fixed times, owners and
// modes; entries in a fixed order).
//
//	redpilot-image --binary PATH [--exporter PATH] --tag REF --layout DIR [--tar FILE]
//	               [--created UNIX_SECONDS] [--label K=V]... [--json FILE]
//
// It writes an OCI image layout (DIR) and, with --tar, a tarball that
// `docker load` reads. It prints the digest and sizes; --json writes them
// as a JSON object too.
package main

import (
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"redpilot.dev/tools/image/internal/tarlayer"
)

// The user the image runs as (the bundle's Deployment says the same).
const (
	uid     = 65532
	user    = "nonroot"
	port    = "8080/tcp"
	caFile  = "/etc/ssl/certs/ca-certificates.crt"
	binPath = "/redpilot"
	// The metrics sidecar the operator puts in every Redis pod runs
	// `redpilot-exporter`, found on the image's PATH.
	exporterPath = "/usr/local/bin/redpilot-exporter"
)

// Where the dynamic loader of a Debian amd64 system looks for libraries.
var libDirs = []string{
	"/lib/x86_64-linux-gnu",
	"/usr/lib/x86_64-linux-gnu",
	"/lib64",
	"/usr/lib64",
	"/lib",
	"/usr/lib",
}

type labels map[string]string

func (l labels) String() string { return fmt.Sprint(map[string]string(l)) }
func (l labels) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("--label wants KEY=VALUE, got %q", v)
	}
	l[k] = val
	return nil
}

// A file of the image: where it goes, what it holds, its mode and owner.
type entry struct {
	path string
	data []byte
	mode int64
	dir  bool
	own  int
	// A symbolic link to this path, when set.
	link string
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redpilot-image:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("binary", "", "the operator binary to put at "+binPath)
	exporter := flag.String("exporter", "", "the metrics sidecar's binary to put at "+exporterPath+" (on PATH)")
	tag := flag.String("tag", "", "the image's reference (e.g. quay.io/redpilot/redpilot:0.2.0)")
	out := flag.String("layout", "", "directory to write the OCI image layout to (replaced)")
	tarOut := flag.String("tar", "", "also write a `docker load` tarball here")
	jsonOut := flag.String("json", "", "also write the digest and sizes as JSON here")
	created := flag.Int64("created", 0, "the image's creation time and every file's mtime, in Unix seconds")
	lbls := labels{}
	flag.Var(lbls, "label", "a config label KEY=VALUE (repeatable)")
	flag.Parse()
	if *bin == "" || *tag == "" || *out == "" {
		flag.Usage()
		return errors.New("--binary, --tag and --layout are required")
	}
	ref, err := name.NewTag(*tag)
	if err != nil {
		return fmt.Errorf("--tag %q: %w", *tag, err)
	}
	when := time.Unix(*created, 0).UTC()

	bins := []string{*bin}
	if *exporter != "" {
		bins = append(bins, *exporter)
	}
	base, pkgs, err := baseFiles(bins)
	if err != nil {
		return err
	}
	lbls["dev.redpilot.image.packages"] = strings.Join(pkgs, " ")
	app, err := os.ReadFile(*bin)
	if err != nil {
		return err
	}
	baseLayer, err := layer(base, when)
	if err != nil {
		return err
	}
	appFiles := []entry{{path: binPath, data: app, mode: 0o755}}
	if *exporter != "" {
		data, err := os.ReadFile(*exporter)
		if err != nil {
			return err
		}
		appFiles = append(appFiles,
			entry{path: "/usr", dir: true, mode: 0o755},
			entry{path: "/usr/local", dir: true, mode: 0o755},
			entry{path: "/usr/local/bin", dir: true, mode: 0o755},
			entry{path: exporterPath, data: data, mode: 0o755})
	}
	appLayer, err := layer(appFiles, when)
	if err != nil {
		return err
	}

	img, err := tarlayer.Image(when, v1.Config{
		Entrypoint:   []string{binPath},
		Cmd:          []string{"run"},
		User:         fmt.Sprintf("%d:%d", uid, uid),
		WorkingDir:   "/",
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=" + caFile},
		ExposedPorts: map[string]struct{}{port: {}},
		Labels:       lbls,
	},
		tarlayer.Layer{Layer: baseLayer, CreatedBy: "redpilot-image: shared libraries, CA certificates, nonroot user"},
		tarlayer.Layer{Layer: appLayer, CreatedBy: "redpilot-image: " + binPath + " and the metrics sidecar"},
	)
	if err != nil {
		return err
	}

	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	lp, err := layout.Write(*out, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.String(),
	})); err != nil {
		return err
	}
	if *tarOut != "" {
		if err := tarball.WriteToFile(*tarOut, ref, img); err != nil {
			return err
		}
	}
	return report(img, ref, *jsonOut)
}

// The files of the base layer, and the Debian packages they came from
// ("name=version", sorted).
func baseFiles(bins []string) ([]entry, []string, error) {
	libs := map[string]string{}
	for _, bin := range bins {
		l, err := sharedLibraries(bin)
		if err != nil {
			return nil, nil, err
		}
		for k, v := range l {
			libs[k] = v
		}
	}
	var files []entry
	dirs := map[string]bool{}
	addDirs := func(p string) {
		for d := path.Dir(p); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var sources []string
	// One copy of each file; a second path to it (the loader is asked for
	// in /lib64 and in the multiarch directory) is a symbolic link, as on
	// Debian.
	inImage := make([]string, 0, len(libs))
	for p := range libs {
		inImage = append(inImage, p)
	}
	sort.Strings(inImage)
	stored := map[string]string{}
	for _, p := range inImage {
		onHost := libs[p]
		addDirs(p)
		if first, ok := stored[onHost]; ok {
			files = append(files, entry{path: p, link: first, mode: 0o777})
			continue
		}
		data, err := os.ReadFile(onHost)
		if err != nil {
			return nil, nil, err
		}
		stored[onHost] = p
		files = append(files, entry{path: p, data: data, mode: 0o755})
		sources = append(sources, onHost)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificates (Debian package ca-certificates): %w", err)
	}
	files = append(files,
		entry{path: caFile, data: ca, mode: 0o644},
		entry{path: "/etc/passwd", mode: 0o644, data: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				fmt.Sprintf("%s:x:%d:%d:%s:/home/%s:/sbin/nologin\n", user, uid, uid, user, user))},
		entry{path: "/etc/group", mode: 0o644, data: []byte(
			"root:x:0:\n" + fmt.Sprintf("%s:x:%d:\n", user, uid))},
		entry{path: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		entry{path: "/home/" + user, dir: true, mode: 0o700, own: uid},
		entry{path: "/tmp", dir: true, mode: 0o1777},
	)
	for _, p := range []string{caFile, "/etc/passwd", "/home/" + user} {
		addDirs(p)
	}
	for d := range dirs {
		files = append(files, entry{path: d, dir: true, mode: 0o755})
	}
	pkgs, err := debianPackages(append(sources, caFile))
	if err != nil {
		return nil, nil, err
	}
	return files, pkgs, nil
}

// The shared libraries `bin` loads, its interpreter among them: the path the
// loader asks for (in the image) → the file that holds it (on this host).
func sharedLibraries(bin string) (map[string]string, error) {
	out := map[string]string{}
	f, err := elf.Open(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return nil, err
		}
		interp := strings.TrimRight(string(b), "\x00")
		real, err := filepath.EvalSymlinks(interp)
		if err != nil {
			return nil, fmt.Errorf("the loader %s: %w", interp, err)
		}
		out[interp] = real
	}
	queue, err := f.ImportedLibraries()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for len(queue) > 0 {
		lib := queue[0]
		queue = queue[1:]
		if seen[lib] {
			continue
		}
		seen[lib] = true
		found := ""
		for _, d := range libDirs {
			if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
				found = filepath.Join(d, lib)
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("%s needs %s, found in none of %v", bin, lib, libDirs)
		}
		real, err := filepath.EvalSymlinks(found)
		if err != nil {
			return nil, err
		}
		// The loader looks in the first multiarch directory.
		out[path.Join(libDirs[0], lib)] = real
		lf, err := elf.Open(real)
		if err != nil {
			return nil, err
		}
		more, err := lf.ImportedLibraries()
		lf.Close()
		if err != nil {
			return nil, err
		}
		queue = append(queue, more...)
	}
	return out, nil
}

// "package=version" of the Debian package owning each file, sorted, once
// each.
func debianPackages(files []string) ([]string, error) {
	set := map[string]bool{}
	for _, f := range files {
		owner := ""
		if f == caFile {
			// Generated by update-ca-certificates from the package's
			// certificates; dpkg does not list it.
			owner = "ca-certificates"
		}
		// A file of a merged /usr is registered under either spelling.
		for _, p := range []string{f, strings.TrimPrefix(f, "/usr")} {
			if owner != "" {
				break
			}
			o, err := exec.Command("dpkg-query", "-S", p).Output()
			if err == nil {
				owner = strings.TrimSpace(strings.SplitN(string(o), ":", 2)[0])
				break
			}
		}
		if owner == "" {
			return nil, fmt.Errorf("%s belongs to no Debian package (dpkg-query -S)", f)
		}
		v, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", owner).Output()
		if err != nil {
			return nil, fmt.Errorf("dpkg-query -W %s: %w", owner, err)
		}
		set[owner+"="+strings.TrimSpace(string(v))] = true
	}
	var out []string
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// One layer of `files`, in path order, every time `when`.
func layer(files []entry, when time.Time) (v1.Layer, error) {
	es := make([]tarlayer.Entry, 0, len(files))
	for _, f := range files {
		es = append(es, tarlayer.Entry{Path: f.path, Data: f.data, Mode: f.mode, Dir: f.dir, Own: f.own, Link: f.link})
	}
	return tarlayer.Build(es, when)
}

func report(img v1.Image, ref name.Tag, jsonOut string) error {
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var compressed, uncompressed int64
	for _, l := range layers {
		c, err := l.Size()
		if err != nil {
			return err
		}
		compressed += c
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
		uncompressed += n
	}
	fmt.Printf("image %s@%s: %d layers, %d bytes compressed, %d uncompressed\n",
		ref.String(), digest, len(layers), compressed, uncompressed)
	if jsonOut == "" {
		return nil
	}
	b, err := json.MarshalIndent(map[string]any{
		"reference":    ref.String(),
		"digest":       digest.String(),
		"layers":       len(layers),
		"compressed":   compressed,
		"uncompressed": uncompressed,
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(jsonOut, append(b, '\n'), 0o644)
}
