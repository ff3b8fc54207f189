// Command redpilot-dirimage builds an OCI image from files on this machine and
// pushes it to a registry: the bundle image (manifests and metadata), the
// catalog image (opm, grpc_health_probe and the rendered catalog) and the
// unpack utility image OLM runs. Like redpilot-image it is reproducible:
// fixed times, owners and modes, entries in a fixed order, one layer.
//
//	redpilot-dirimage --push REF [--add SRC:DEST]... [--link DEST:TARGET]...
//	                  [--label K=V]... [--entrypoint JSON] [--cmd JSON]
//	                  [--user U] [--env K=V]... [--created UNIX_SECONDS]
//	                  [--chown UID:/DEST]... [--json FILE]
//
// --add copies a file, or a directory tree, to DEST in the image (permission
// bits as the files have them, which opm's serving cache checks; owners are
// 0, or UID for what --chown names: a directory the image's user writes
// to). --link adds a symbolic link.
// The registry is reached over plain HTTP when it is a loopback address, as
// go-containerregistry does for localhost. It prints the reference with its
// digest; --json writes reference, digest and size as JSON too.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"redpilot.dev/tools/image/internal/tarlayer"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redpilot-dirimage:", err)
		os.Exit(1)
	}
}

func run() error {
	var adds, links, lbls, envs, chowns list
	push := flag.String("push", "", "the reference to push to (REGISTRY/REPO:TAG)")
	entrypoint := flag.String("entrypoint", "", "the entrypoint as a JSON array")
	cmd := flag.String("cmd", "", "the default arguments as a JSON array")
	user := flag.String("user", "", "the user the image runs as (UID[:GID])")
	created := flag.Int64("created", 0, "creation time and every file's mtime, Unix seconds")
	jsonOut := flag.String("json", "", "write reference, digest and size here as JSON")
	flag.Var(&adds, "add", "SRC:DEST, a file or directory tree (repeatable)")
	flag.Var(&links, "link", "DEST:TARGET, a symbolic link (repeatable)")
	flag.Var(&lbls, "label", "a config label K=V (repeatable)")
	flag.Var(&envs, "env", "an environment variable K=V (repeatable)")
	flag.Var(&chowns, "chown", "UID:/DEST, owner of DEST and everything under it (repeatable)")
	flag.Parse()
	if *push == "" {
		flag.Usage()
		return errors.New("--push is required")
	}
	ref, err := name.NewTag(*push)
	if err != nil {
		return fmt.Errorf("--push %q: %w", *push, err)
	}
	when := time.Unix(*created, 0).UTC()

	files := map[string]tarlayer.Entry{}
	addDirs := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := files[d]; !ok {
				files[d] = tarlayer.Entry{Path: d, Dir: true, Mode: 0o755}
			}
		}
	}
	for _, a := range adds {
		src, dest, ok := strings.Cut(a, ":")
		if !ok || !strings.HasPrefix(dest, "/") {
			return fmt.Errorf("--add %q: want SRC:/DEST", a)
		}
		err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return err
			}
			in := path.Clean(path.Join(dest, filepath.ToSlash(rel)))
			addDirs(in)
			// Follow symbolic links: the image holds the file itself.
			info, err := os.Stat(p)
			if err != nil {
				return err
			}
			if d.IsDir() {
				files[in] = tarlayer.Entry{Path: in, Dir: true, Mode: int64(info.Mode().Perm())}
				return nil
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			files[in] = tarlayer.Entry{Path: in, Data: data, Mode: int64(info.Mode().Perm())}
			return nil
		})
		if err != nil {
			return fmt.Errorf("--add %q: %w", a, err)
		}
	}
	for _, l := range links {
		dest, target, ok := strings.Cut(l, ":")
		if !ok || !strings.HasPrefix(dest, "/") {
			return fmt.Errorf("--link %q: want /DEST:TARGET", l)
		}
		addDirs(dest)
		files[dest] = tarlayer.Entry{Path: dest, Link: target, Mode: 0o777}
	}
	ordered := make([]tarlayer.Entry, 0, len(files))
	for _, f := range files {
		for _, c := range chowns {
			id, dest, ok := strings.Cut(c, ":")
			var uid int
			if _, err := fmt.Sscanf(id, "%d", &uid); !ok || err != nil || !strings.HasPrefix(dest, "/") {
				return fmt.Errorf("--chown %q: want UID:/DEST", c)
			}
			if f.Path == dest || strings.HasPrefix(f.Path, strings.TrimSuffix(dest, "/")+"/") {
				f.Own = uid
			}
		}
		ordered = append(ordered, f)
	}
	lyr, err := tarlayer.Build(ordered, when)
	if err != nil {
		return err
	}

	labels := map[string]string{}
	for _, l := range lbls {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("--label %q: want K=V", l)
		}
		labels[k] = v
	}
	config := v1.Config{Labels: labels, Env: envs, User: *user, WorkingDir: "/"}
	if *entrypoint != "" {
		if err := json.Unmarshal([]byte(*entrypoint), &config.Entrypoint); err != nil {
			return fmt.Errorf("--entrypoint: %w", err)
		}
	}
	if *cmd != "" {
		if err := json.Unmarshal([]byte(*cmd), &config.Cmd); err != nil {
			return fmt.Errorf("--cmd: %w", err)
		}
	}
	img, err := tarlayer.Image(when, config, tarlayer.Layer{Layer: lyr, CreatedBy: "redpilot-dirimage"})
	if err != nil {
		return err
	}
	if err := remote.Write(ref, img); err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := lyr.Size()
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s (%d bytes compressed)\n", ref.String(), digest, size)
	if *jsonOut == "" {
		return nil
	}
	b, err := json.MarshalIndent(map[string]any{
		"reference": ref.String(), "digest": digest.String(), "compressed": size,
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
}
