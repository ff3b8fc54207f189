package tarlayer

import (
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Layer is a layer of an image and the history line that says what it holds.
type Layer struct {
	Layer     v1.Layer
	CreatedBy string
}

// Image is an OCI image (linux/amd64) of the layers, in order, with config,
// every time in it set to when.
func Image(when time.Time, config v1.Config, layers ...Layer) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	adds := make([]mutate.Addendum, 0, len(layers))
	for _, l := range layers {
		adds = append(adds, mutate.Addendum{Layer: l.Layer, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: when}, CreatedBy: l.CreatedBy}})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = "amd64"
	cf.OS = "linux"
	cf.Created = v1.Time{Time: when}
	cf.Config = config
	return mutate.ConfigFile(img, cf)
}
