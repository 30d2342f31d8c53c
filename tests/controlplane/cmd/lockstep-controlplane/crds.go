package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
)

var crdResource = schema.GroupVersionResource{
	Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions",
}

// readCRDs reads every CustomResourceDefinition in the YAML (or JSON) files, unchanged:
// unstructured, so the server sees exactly what the file says.
func readCRDs(files []string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
		for {
			obj := map[string]any{}
			err := dec.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				_ = f.Close()
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			if len(obj) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: obj}
			if u.GetKind() != "CustomResourceDefinition" {
				_ = f.Close()
				return nil, fmt.Errorf("%s: %s %q is not a CustomResourceDefinition", file, u.GetKind(), u.GetName())
			}
			out = append(out, u)
		}
		_ = f.Close()
	}
	return out, nil
}

// installCRDs creates the CRDs and waits until each is established and its resources are
// served. The supervisor does this before it starts the controller manager, so the
// garbage collector and every other controller know the new kinds from their first
// discovery (the garbage collector re-reads discovery only every 30 seconds).
func (s *supervisor) installCRDs(ctx context.Context, crds []*unstructured.Unstructured) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.path(adminKubeconfigName))
	if err != nil {
		return err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := client.Resource(crdResource)
	for _, crd := range crds {
		_, err := api.Create(ctx, crd, metav1.CreateOptions{FieldValidation: "Strict"})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("CRD %s: %w", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		if err := waitServed(ctx, client, crd); err != nil {
			return fmt.Errorf("CRD %s: %w", crd.GetName(), err)
		}
	}
	return nil
}

func waitServed(ctx context.Context, client dynamic.Interface, crd *unstructured.Unstructured) error {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	var lastErr error
	for {
		lastErr = nil
		current, err := client.Resource(crdResource).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err == nil && !isEstablished(current) {
			err = errors.New("not established")
		}
		if err != nil {
			lastErr = err
		}
		for _, v := range versions {
			version, _ := v.(map[string]any)
			name, _ := version["name"].(string)
			if served, ok := version["served"].(bool); lastErr != nil || (ok && !served) {
				continue
			}
			gvr := schema.GroupVersionResource{Group: group, Version: name, Resource: plural}
			if _, err := client.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				lastErr = fmt.Errorf("%s not served: %w", gvr, err)
			}
		}
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func isEstablished(crd *unstructured.Unstructured) bool {
	conditions, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conditions {
		cond, _ := c.(map[string]any)
		if cond["type"] == "Established" && cond["status"] == "True" {
			return true
		}
	}
	return false
}
