// Command catalog-semver writes the channels and the package of a file-based
// catalog from an olm.semver catalog template, with operator-registry's
// semver template: the code `opm alpha render-template semver` runs.
//
//	catalog-semver -template catalog/redpilot.semver.yaml \
//	    -bundles catalog/redpilot/bundles -out catalog/redpilot \
//	    -bundle-image quay.io/redpilot/redpilot-bundle \
//	    -description TEXT -icon config/manifests/icon/redpilot.svg
//
// `opm alpha render-template semver` pulls every bundle image the template
// names. Here each reference REPO:VERSION is instead resolved to the bundle of
// that version already rendered into the catalog (-bundles, one `opm render`
// output per release), so the channels are computed from exactly the bundles
// the catalog ships, and no registry is needed. Those bundles keep the image
// `opm render` gave them; the bundle images only name them in the template.
//
// The template generates major-version channels (<archetype>-v<major>). A
// subscription to a plain archetype (candidate, fast, stable) keeps working:
// each is written as a copy of its only major channel, and more than one
// major line is refused, since the template links no major to the next.
//
// Written: OUT/channels.yaml (every channel) and OUT/package.yaml (the
// template's olm.package and default channel, with -description and -icon),
// each headed by -header. Bundles are not written.
//
//	catalog-semver -archetypes RENDERED -out FILE
//
// adds the same archetype channels to a catalog that `opm alpha
// render-template semver` rendered from pushed bundle images (hack/publish.sh)
// and writes it whole, as JSON, to FILE.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/operator-framework/operator-registry/alpha/declcfg"
	"github.com/operator-framework/operator-registry/alpha/property"
	"github.com/operator-framework/operator-registry/alpha/template/api"
	"github.com/operator-framework/operator-registry/alpha/template/semver"
)

// The channel archetypes of the semver template, least stable first.
var archetypes = []string{"candidate", "fast", "stable"}

// A generated major-version channel: archetype and major.
var majorChannel = regexp.MustCompile(`^(candidate|fast|stable)-v([0-9]+)$`)

type options struct {
	archetypes  string
	template    string
	bundles     string
	out         string
	bundleImage string
	description string
	icon        string
	header      string
}

func main() {
	var o options
	flag.StringVar(&o.archetypes, "archetypes", "", "a rendered catalog to add the archetype channels to (with -out FILE)")
	flag.StringVar(&o.template, "template", "", "the olm.semver catalog template")
	flag.StringVar(&o.bundles, "bundles", "", "directory of the rendered bundles, one or more per file")
	flag.StringVar(&o.out, "out", "", "directory to write channels.yaml and package.yaml into")
	flag.StringVar(&o.bundleImage, "bundle-image", "", "repository of the bundle images the template names (REPO:VERSION)")
	flag.StringVar(&o.description, "description", "", "the package's description")
	flag.StringVar(&o.icon, "icon", "", "the package's icon (.svg or .png)")
	flag.StringVar(&o.header, "header", "", "comment line written at the top of each file")
	flag.Parse()
	if o.archetypes != "" && o.out != "" && flag.NArg() == 0 {
		if err := addArchetypes(o.archetypes, o.out); err != nil {
			fmt.Fprintf(os.Stderr, "catalog-semver: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if o.template == "" || o.bundles == "" || o.out == "" || o.bundleImage == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: catalog-semver -template FILE -bundles DIR -out DIR -bundle-image REPO [-description TEXT] [-icon FILE] [-header TEXT]\n       catalog-semver -archetypes RENDERED -out FILE")
		os.Exit(2)
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintf(os.Stderr, "catalog-semver: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	idx, err := loadBundles(ctx, o.bundles)
	if err != nil {
		return err
	}
	tmpl, err := os.Open(o.template)
	if err != nil {
		return err
	}
	defer tmpl.Close()
	factory := semver.Factory{}
	cfg, err := factory.CreateTemplate(idx.renderer(o.bundleImage)).Render(ctx, tmpl)
	if err != nil {
		return fmt.Errorf("%s: %w", o.template, err)
	}
	for _, v := range idx.versions {
		if !idx.used[v] {
			return fmt.Errorf("the bundle of version %s in %s is in no channel of %s", v, o.bundles, o.template)
		}
	}
	if len(cfg.Packages) != 1 {
		return fmt.Errorf("%s: the template rendered %d packages, expected 1", o.template, len(cfg.Packages))
	}
	channels, err := withArchetypeChannels(cfg.Channels)
	if err != nil {
		return err
	}
	// The template fills these from the head bundle's CSV; the package
	// carries the ones given instead.
	pkg := cfg.Packages[0]
	pkg.Description = o.description
	pkg.Icon = nil
	if o.icon != "" {
		if pkg.Icon, err = loadIcon(o.icon); err != nil {
			return err
		}
	}
	if err := write(filepath.Join(o.out, "package.yaml"), o.header, declcfg.DeclarativeConfig{Packages: []declcfg.Package{pkg}}); err != nil {
		return err
	}
	return write(filepath.Join(o.out, "channels.yaml"), o.header, declcfg.DeclarativeConfig{Channels: channels})
}

// bundleIndex holds the rendered bundles by version.
type bundleIndex struct {
	dir       string
	byVersion map[string]declcfg.Bundle
	versions  []string
	used      map[string]bool
}

func loadBundles(ctx context.Context, dir string) (*bundleIndex, error) {
	cfg, err := declcfg.LoadFS(ctx, os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("loading the bundles in %s: %w", dir, err)
	}
	if n := len(cfg.Packages) + len(cfg.Channels) + len(cfg.Deprecations) + len(cfg.Others); n > 0 {
		return nil, fmt.Errorf("%s holds %d objects that are not bundles", dir, n)
	}
	idx := &bundleIndex{dir: dir, byVersion: map[string]declcfg.Bundle{}, used: map[string]bool{}}
	for _, b := range cfg.Bundles {
		props, err := property.Parse(b.Properties)
		if err != nil {
			return nil, fmt.Errorf("bundle %s in %s: %w", b.Name, dir, err)
		}
		if len(props.Packages) != 1 {
			return nil, fmt.Errorf("bundle %s in %s has %d olm.package properties, expected 1", b.Name, dir, len(props.Packages))
		}
		v := props.Packages[0].Version
		if other, dup := idx.byVersion[v]; dup {
			return nil, fmt.Errorf("bundles %s and %s in %s are both version %s", other.Name, b.Name, dir, v)
		}
		idx.byVersion[v] = b
		idx.versions = append(idx.versions, v)
	}
	if len(idx.versions) == 0 {
		return nil, fmt.Errorf("no bundle in %s", dir)
	}
	slices.Sort(idx.versions)
	return idx, nil
}

// renderer resolves the template's bundle reference REPO:VERSION to the
// rendered bundle of that version. The template tells bundles apart by their
// image, so the bundle it gets carries the reference; what is written is
// only channels and the package, never these copies.
func (idx *bundleIndex) renderer(repo string) api.BundleRenderer {
	return func(_ context.Context, ref string) (*declcfg.DeclarativeConfig, error) {
		version, ok := strings.CutPrefix(ref, repo+":")
		if !ok || version == "" {
			return nil, fmt.Errorf("bundle reference %q is not %s:<version>", ref, repo)
		}
		b, ok := idx.byVersion[version]
		if !ok {
			return nil, fmt.Errorf("bundle reference %q: no rendered bundle of version %s in %s", ref, version, idx.dir)
		}
		idx.used[version] = true
		b.Image = ref
		return &declcfg.DeclarativeConfig{Bundles: []declcfg.Bundle{b}}, nil
	}
}

// addArchetypes reads the catalog `in`, adds the archetype channels and
// writes the whole catalog as JSON to `out`.
func addArchetypes(in, out string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg, err := declcfg.LoadReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if cfg.Channels, err = withArchetypeChannels(cfg.Channels); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := declcfg.WriteJSON(*cfg, &buf); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// withArchetypeChannels adds, for each archetype the template filled, a
// channel named after the archetype alone with the entries of its major
// channel, for subscriptions made to it before the channels were split by
// major version.
func withArchetypeChannels(generated []declcfg.Channel) ([]declcfg.Channel, error) {
	byArchetype := map[string][]declcfg.Channel{}
	for _, ch := range generated {
		m := majorChannel.FindStringSubmatch(ch.Name)
		if m == nil {
			return nil, fmt.Errorf("generated channel %q is not a major-version channel <archetype>-v<major>: the template must set generateMajorChannels and not generateMinorChannels", ch.Name)
		}
		byArchetype[m[1]] = append(byArchetype[m[1]], ch)
	}
	out := slices.Clone(generated)
	for _, a := range archetypes {
		chs := byArchetype[a]
		switch len(chs) {
		case 0:
			continue
		case 1:
		default:
			names := make([]string, len(chs))
			for i, ch := range chs {
				names[i] = ch.Name
			}
			return nil, fmt.Errorf("the releases in %s span more than one major version (%s): channel %q, kept for subscriptions made to it, follows one major line, and the semver template links no major line to the next; decide how %q subscribers reach the new major and extend this tool", a, strings.Join(names, ", "), a, a)
		}
		ch := chs[0]
		ch.Name = a
		ch.Entries = slices.Clone(ch.Entries)
		out = append(out, ch)
	}
	return out, nil
}

func loadIcon(path string) (*declcfg.Icon, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	types := map[string]string{".svg": "image/svg+xml", ".png": "image/png"}
	t, ok := types[strings.ToLower(filepath.Ext(path))]
	if !ok {
		return nil, fmt.Errorf("icon %s: not .svg or .png", path)
	}
	return &declcfg.Icon{Data: data, MediaType: t}, nil
}

// write writes cfg as YAML, headed by a comment, replacing path at once. The
// comment belongs to the first document: an empty document before it would
// be an object without a schema.
func write(path, header string, cfg declcfg.DeclarativeConfig) error {
	var docs bytes.Buffer
	if err := declcfg.WriteYAML(cfg, &docs); err != nil {
		return err
	}
	var buf bytes.Buffer
	if header != "" {
		for _, l := range strings.Split(header, "\n") {
			fmt.Fprintf(&buf, "# %s\n", l)
		}
	}
	buf.Write(bytes.TrimPrefix(docs.Bytes(), []byte("---\n")))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
