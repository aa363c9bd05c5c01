// Package v1alpha1 holds the fleet.bootc.dev/v1alpha1 API: BootcNodePool and BootcNode.
//
// +kubebuilder:object:generate=true
// +groupName=fleet.bootc.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "fleet.bootc.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes adds the kinds of this package, with the meta types of
// their group version (options, status, watch events).
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &BootcNodePool{}, &BootcNodePoolList{}, &BootcNode{}, &BootcNodeList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
