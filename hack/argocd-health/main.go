// argocd-health runs an Argo CD health check in Argo CD's own code, the way its application
// controller does: the argocd-cm ConfigMap is read by util/settings' SettingsManager (from a
// fake clientset, so the ConfigMap's key and its app.kubernetes.io/part-of label count as in a
// cluster), the resource overrides go to util/lua's ResourceHealthOverrides, and each object's
// health comes from the gitops engine's health.GetResourceHealth, which calls the Lua script in
// gopher-lua with Argo CD's libraries, sandbox and timeout.
//
// Usage:
//
//	argocd-health -script health.lua -resource eopipe.dev_ExactlyOncePipeline < objects.json
//	argocd-health -configmap argocd-cm.yaml < objects.json
//	argocd-health -version
//
// objects.json is a JSON list of Kubernetes objects, or a List of them as `kubectl get -o json`
// prints it. Prints a JSON list with one entry per object: {"status": ..., "message": ...}, or {"error": ...} when the script failed, or
// {"status": ""} when no health check applies to the object's kind.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"github.com/argoproj/gitops-engine/pkg/health"
	log "github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"github.com/argoproj/argo-cd/v3/util/settings"
)

const argoModule = "github.com/argoproj/argo-cd/v3"

type result struct {
	Status  string `json:"status"`
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
}

func main() {
	script := flag.String("script", "", "a Lua health script")
	resource := flag.String("resource", "", "the <group>_<kind> of -script, as in argocd-cm's resource.customizations.health.<group>_<kind>")
	configMap := flag.String("configmap", "", "an argocd-cm ConfigMap (YAML) instead of -script/-resource")
	version := flag.Bool("version", false, "print the Argo CD module version built in and exit")
	flag.Parse()
	if *version {
		fmt.Println(argoVersion())
		return
	}
	if err := run(*script, *resource, *configMap, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
		os.Exit(1)
	}
}

func run(script, resource, configMap string, in io.Reader, out io.Writer) error {
	cm, err := loadConfigMap(script, resource, configMap)
	if err != nil {
		return err
	}
	raw, err := readObjects(in)
	if err != nil {
		return err
	}
	// The settings manager logs its choices at Info; only problems matter here.
	log.SetLevel(log.WarnLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mgr := settings.NewSettingsManager(ctx, fake.NewClientset(cm), cm.Namespace)
	overrides, err := mgr.GetResourceOverrides()
	if err != nil {
		return fmt.Errorf("argocd-cm: %w", err)
	}
	healthOverrides := lua.ResourceHealthOverrides(overrides)
	results := make([]result, 0, len(raw))
	for i, r := range raw {
		// Unstructured's own JSON decoding, as the controller's objects are decoded:
		// integers become int64 (observedGeneration, generation), not float64.
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(r); err != nil {
			return fmt.Errorf("object %d: %w", i, err)
		}
		hs, err := health.GetResourceHealth(obj, healthOverrides)
		switch {
		case err != nil:
			results = append(results, result{Error: err.Error()})
		case hs == nil:
			results = append(results, result{})
		default:
			results = append(results, result{Status: string(hs.Status), Message: hs.Message})
		}
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(results)
}

// readObjects takes a JSON list of objects, or a List object (`kubectl get -o json`).
func readObjects(in io.Reader) ([]json.RawMessage, error) {
	var doc json.RawMessage
	if err := json.NewDecoder(in).Decode(&doc); err != nil {
		return nil, fmt.Errorf("objects: %w", err)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(doc, &raw); err == nil {
		return raw, nil
	}
	var list struct {
		Items *[]json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(doc, &list); err != nil || list.Items == nil {
		return nil, fmt.Errorf("objects: want a JSON list of objects or a List with items")
	}
	return *list.Items, nil
}

// loadConfigMap reads an argocd-cm, or makes one holding the script under its resource key.
func loadConfigMap(script, resource, configMap string) (*corev1.ConfigMap, error) {
	if configMap != "" {
		if script != "" || resource != "" {
			return nil, fmt.Errorf("-configmap excludes -script and -resource")
		}
		data, err := os.ReadFile(configMap)
		if err != nil {
			return nil, err
		}
		cm := &corev1.ConfigMap{}
		if err := yaml.UnmarshalStrict(data, cm); err != nil {
			return nil, fmt.Errorf("%s: %w", configMap, err)
		}
		if cm.Name != common.ArgoCDConfigMapName {
			return nil, fmt.Errorf("%s: Argo CD reads its settings from the ConfigMap %q, not %q",
				configMap, common.ArgoCDConfigMapName, cm.Name)
		}
		if cm.Namespace == "" {
			cm.Namespace = "argocd"
		}
		return cm, nil
	}
	if script == "" || resource == "" {
		return nil, fmt.Errorf("give -script and -resource, or -configmap (see -h)")
	}
	lua, err := os.ReadFile(script)
	if err != nil {
		return nil, err
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      common.ArgoCDConfigMapName,
			Namespace: "argocd",
			Labels:    map[string]string{"app.kubernetes.io/part-of": "argocd"},
		},
		Data: map[string]string{"resource.customizations.health." + resource: string(lua)},
	}, nil
}

func argoVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == argoModule {
			return dep.Version
		}
	}
	return "unknown"
}
