// Package tarlayer writes reproducible image layers (entries in path order,
// every time set to the image's creation time, owners and modes as given,
// PAX headers) and the image around them (image.go).
package tarlayer

import (
	"archive/tar"
	"bytes"
	"io"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entry is one file, directory or symbolic link of a layer.
type Entry struct {
	Path string
	Data []byte
	Mode int64
	Dir  bool
	// Owner (user and group ID).
	Own int
	// A symbolic link to this target, when set.
	Link string
}

// Build writes the entries as an OCI layer (gzip-compressed on upload).
func Build(files []Entry, when time.Time) (v1.Layer, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name:    strings.TrimPrefix(f.Path, "/"),
			Mode:    f.Mode,
			Uid:     f.Own,
			Gid:     f.Own,
			ModTime: when,
			Format:  tar.FormatPAX,
		}
		switch {
		case f.Dir:
			h.Typeflag = tar.TypeDir
			h.Name += "/"
		case f.Link != "":
			h.Typeflag = tar.TypeSymlink
			h.Linkname = f.Link
		default:
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
