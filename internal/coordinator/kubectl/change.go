package kubectl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// setPaused sets spec.rollout.paused with a merge patch (no read-modify-
// write of the whole spec, so it cannot undo a concurrent edit).
func (r *reader) setPaused(ctx context.Context, name string, paused bool) (string, error) {
	p, err := r.pool(ctx, name)
	if err != nil {
		return "", err
	}
	word := map[bool]string{true: "paused", false: "resumed"}[paused]
	if p.Spec.Rollout.Paused == paused {
		return fmt.Sprintf("bootcnodepool/%s already %s (spec.rollout.paused is %t): nothing changed", name, map[bool]string{true: "paused", false: "running"}[paused], paused), nil
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"rollout": map[string]any{"paused": paused}}})
	if err := r.c.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return "", apiError(err, "patch", "bootcnodepools.fleet.bootc.dev")
	}
	what := "no new grants; work already granted finishes"
	if !paused {
		what = "the coordinator grants slots again"
	}
	return fmt.Sprintf("bootcnodepool/%s %s: spec.rollout.paused %t -> %t (%s)", name, word, !paused, paused, what), nil
}

// setHold sets (reason non-nil) or removes the Node's hold annotation.
// With keep, a node already held keeps its reason.
func (r *reader) setHold(ctx context.Context, name string, reason *string, keep bool) (string, error) {
	n := &corev1.Node{}
	if err := r.c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		if isNotFound(err) {
			return "", fmt.Errorf("node %q not found", name)
		}
		return "", apiError(err, "get", "nodes")
	}
	old, had := n.Annotations[fleetv1.AnnotationHold]
	var value any // nil removes the annotation in a merge patch
	switch {
	case reason == nil && !had:
		return fmt.Sprintf("node/%s was not held: nothing changed", name), nil
	case reason != nil && had && (old == *reason || keep):
		return fmt.Sprintf("node/%s already held (%s): nothing changed", name, quoted(old)), nil
	case reason != nil:
		value = *reason
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{fleetv1.AnnotationHold: value}}})
	if err := r.c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return "", apiError(err, "patch", "nodes")
	}
	bn := &fleetv1.BootcNode{}
	note := ""
	if err := r.c.Get(ctx, client.ObjectKey{Name: name}, bn); isNotFound(err) {
		note = " (it has no BootcNode: no pool manages it yet)"
	}
	switch {
	case reason == nil:
		return fmt.Sprintf("node/%s released: annotation %s (%s) removed; it takes part in rollouts again%s", name, fleetv1.AnnotationHold, quoted(old), note), nil
	case had:
		return fmt.Sprintf("node/%s hold reason changed: %s -> %s%s", name, quoted(old), quoted(*reason), note), nil
	}
	return fmt.Sprintf("node/%s held: annotation %s=%s; it gets no new grant, what it holds finishes%s", name, fleetv1.AnnotationHold, quoted(*reason), note), nil
}

func quoted(s string) string { return fmt.Sprintf("%q", s) }

// printReport prints v as JSON or YAML, or as text through table.
func printReport(w io.Writer, format string, v any, table func(io.Writer)) error {
	switch format {
	case FormatJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case FormatYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	table(w)
	return nil
}
