package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// NewRESTClient returns a REST client for group fleet.bootc.dev/v1alpha1
// (JSON, typed objects) with cfg's credentials: for informers and patches of
// BootcNodes and pools without a controller-runtime client.
func NewRESTClient(cfg *rest.Config) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		return nil, err
	}
	fc := rest.CopyConfig(cfg)
	fc.GroupVersion = &GroupVersion
	fc.APIPath = "/apis"
	fc.ContentType = runtime.ContentTypeJSON
	fc.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	return rest.RESTClientFor(fc)
}
