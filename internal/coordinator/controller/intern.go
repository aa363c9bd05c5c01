package controller

import (
	"unique"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Cached objects repeat the same strings: every BootcNode of a pool names
// the same images, digests, phase, reasons and owner; every Node carries
// the same label keys and mostly the same values. Decoding gives each
// object its own copy of each; the cache's transforms replace them with one
// shared copy (unique.Make: the table is the runtime's, weak, so it holds
// nothing no object uses). Strings of one object alone (names, UIDs, boot
// IDs, resourceVersions) are left as decoded.

func intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// internMap gives m's keys and values one shared copy each.
func internMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[intern(k)] = intern(v)
	}
	return out
}

// internMeta interns what objects of a kind share in their metadata.
func internMeta(m *metav1.ObjectMeta) {
	m.Labels = internMap(m.Labels)
	m.Annotations = internMap(m.Annotations)
	for i := range m.OwnerReferences {
		r := &m.OwnerReferences[i]
		r.APIVersion, r.Kind, r.Name, r.UID = intern(r.APIVersion), intern(r.Kind), intern(r.Name), internUID(r.UID)
	}
}

func internUID[T ~string](s T) T { return T(intern(string(s))) }

// internDeployment interns a deployment's image, digest and signature, and
// drops its version and timestamp, which the coordinator never reads (the
// plugin reads them from the API server).
func internDeployment(d *fleetv1.Deployment) {
	if d != nil {
		d.Image, d.Digest, d.Signature = intern(d.Image), intern(d.Digest), internUID(d.Signature)
		d.Version, d.Timestamp = "", nil
	}
}

// internBootcNode interns what BootcNodes share: their metadata's maps and
// owner, the spec's pool and image, the images, phase, reason and message
// of their status, its conditions and the grants its node works under. The
// agent's version, and each deployment's version and timestamp, are
// dropped: nothing the coordinator decides or writes reads them, and its
// BootcNode writes are merge patches of its own fields.
func internBootcNode(bn *fleetv1.BootcNode) {
	internMeta(&bn.ObjectMeta)
	bn.Spec.Pool, bn.Spec.DesiredImage, bn.Spec.RebootPolicy = intern(bn.Spec.Pool), intern(bn.Spec.DesiredImage), internUID(bn.Spec.RebootPolicy)
	st := &bn.Status
	internDeployment(st.Booted)
	internDeployment(st.Staged)
	internDeployment(st.Rollback)
	st.Phase, st.Reason, st.Message, st.AgentVersion = internUID(st.Phase), intern(st.Reason), intern(st.Message), ""
	for i := range st.Conditions {
		c := &st.Conditions[i]
		c.Type, c.Status, c.Reason, c.Message = intern(c.Type), internUID(c.Status), intern(c.Reason), intern(c.Message)
	}
	for i := range st.Grants {
		g := &st.Grants[i]
		g.Lease, g.UID, g.Released = intern(g.Lease), internUID(g.UID), intern(g.Released)
	}
}

// sharedStrings is the cache's transform of every kind but Nodes (slimNode):
// managedFields stripped, metadata interned, and a BootcNode's spec and
// status.
func sharedStrings(strip cache.TransformFunc) cache.TransformFunc {
	return func(in any) (any, error) {
		out, err := strip(in)
		if err != nil {
			return out, err
		}
		switch o := out.(type) {
		case *fleetv1.BootcNode:
			internBootcNode(o)
		case metav1.ObjectMetaAccessor:
			if m, ok := o.GetObjectMeta().(*metav1.ObjectMeta); ok {
				internMeta(m)
			}
		}
		return out, nil
	}
}
