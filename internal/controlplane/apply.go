package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Apply creates or replaces every object of the given multi-document YAML
// files with server-side apply, as `kubectl apply --server-side` would.
func Apply(ctx context.Context, c client.Client, files ...string) error {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			obj := &unstructured.Unstructured{}
			if err := utilyaml.Unmarshal(doc, &obj.Object); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			ac := client.ApplyConfigurationFromUnstructured(obj)
			if err := c.Apply(ctx, ac, client.FieldOwner("bootc-fleet-tests"), client.ForceOwnership); err != nil {
				return fmt.Errorf("%s: applying %s %s: %w", f, obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	return nil
}
