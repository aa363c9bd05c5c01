package v1alpha1_test

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
)

// unstructuredCodecs lets a raw REST client ask for a Table and read the bytes.
type unstructuredCodecs struct{}

func (unstructuredCodecs) SupportedMediaTypes() []runtime.SerializerInfo {
	return serializer.NewCodecFactory(scheme.Scheme).WithoutConversion().SupportedMediaTypes()
}

func (unstructuredCodecs) EncoderForVersion(e runtime.Encoder, _ runtime.GroupVersioner) runtime.Encoder {
	return e
}

func (unstructuredCodecs) DecoderToVersion(d runtime.Decoder, _ runtime.GroupVersioner) runtime.Decoder {
	return d
}
