package drain

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// autoscalerMarks is the change of the autoscaler marks that goes with a
// cordon for mark (hold, for the slot the mark names) or an uncordon
// (release). A record or mark it cannot keep is logged and changes no mark:
// the cordon is written all the same.
func (d *Drainer) autoscalerMarks(n *corev1.Node, cordon bool, mark string) map[string]*string {
	var (
		change map[string]*string
		err    error
	)
	switch {
	case !cordon:
		change, err = lease.ReleaseFromAutoscalers(n.Annotations)
	case mark != "":
		slot, _, _ := strings.Cut(mark, "#")
		change, err = lease.HoldFromAutoscalers(n.Annotations, slot)
	}
	if err != nil {
		d.log.Info("autoscaler marks left as they are", "node", n.Name, "error", err.Error())
		return nil
	}
	return change
}

// MarkAutoscalers holds node from autoscalers for reboot slot slot
// (lease.HoldFromAutoscalers), or, with slot "", restores what a hold set
// (lease.ReleaseFromAutoscalers), with one conditional update; nothing is
// written when nothing changes, or when the Node is gone. A record or mark
// the coordinator cannot keep is an error matching lease.ErrAutoscalerRecord,
// and nothing is written. written and seen are as for Cordon.
func (d *Drainer) MarkAutoscalers(ctx context.Context, node, slot string, seen *corev1.Node) (written *corev1.Node, err error) {
	what, done := "releasing node "+node+" to autoscalers", "released node to autoscalers"
	if slot != "" {
		what, done = "holding node "+node+" from autoscalers", "held node from autoscalers"
	}
	for {
		n := seen
		seen = nil
		if n == nil || n.Name != node {
			if n, err = d.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return nil, nil
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
		}
		var change map[string]*string
		if slot != "" {
			change, err = lease.HoldFromAutoscalers(n.Annotations, slot)
		} else {
			change, err = lease.ReleaseFromAutoscalers(n.Annotations)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if len(change) == 0 {
			return nil, nil
		}
		body, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": n.ResourceVersion, "annotations": change},
		})
		if err != nil {
			return nil, err
		}
		written, err = d.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
		switch {
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		d.log.Info(done, "node", node, "slot", slot)
		return written, nil
	}
}
