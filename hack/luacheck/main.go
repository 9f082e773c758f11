// Command luacheck shows the health Argo CD would show for Kubernetes objects, running the health
// checks of an argocd-cm ConfigMap the way Argo CD runs them (argocd.go): gopher-lua v1.1.2 with
// only the safe libraries open unless the ConfigMap sets useOpenLibs for the kind.
//
//	kubectl -n argocd get configmap argocd-cm -o json > cm.json
//	kubectl get mtrlrun wordle -o json | luacheck -argocd-cm cm.json
//
// stdin holds one object or a List of them (`kubectl get -o json` prints either). For each object
// it prints one JSON line: {"health": {"status": ..., "message": ...}} as Argo CD records it,
// "health": null when no health check applies, and "error" with what Argo CD logs when the
// script failed (the health is then Unknown with the Lua error as its message).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
)

type result struct {
	Health *healthStatus `json:"health"`
	Error  string        `json:"error,omitempty"`
}

func main() {
	cmPath := flag.String("argocd-cm", "", "the argocd-cm ConfigMap as JSON")
	flag.Parse()
	if *cmPath == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: luacheck -argocd-cm CONFIGMAP.json < OBJECTS.json")
		os.Exit(2)
	}
	if err := run(*cmPath, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "luacheck:", err)
		os.Exit(1)
	}
}

func run(cmPath string, in io.Reader, out io.Writer) error {
	raw, err := os.ReadFile(cmPath)
	if err != nil {
		return err
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal(raw, &cm); err != nil {
		return fmt.Errorf("%s: %w", cmPath, err)
	}
	overrides, err := overridesFromConfigMap(cm.Data)
	if err != nil {
		return err
	}
	objects, err := readObjects(in)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for _, obj := range objects {
		health, err := resourceHealth(obj, overrides)
		r := result{Health: health}
		if err != nil {
			r.Error = err.Error()
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// readObjects decodes like apimachinery's unstructured JSON scheme (k8s.io/apimachinery
// pkg/util/json.Unmarshal): integers become int64, other numbers float64.
func readObjects(in io.Reader) ([]map[string]any, error) {
	raw, err := io.ReadAll(in)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("stdin: %w", err)
	}
	convertNumbers(obj)
	items, isList := obj["items"].([]any)
	if !isList {
		return []map[string]any{obj}, nil
	}
	objects := make([]map[string]any, 0, len(items))
	for i, item := range items {
		o, ok := item.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("stdin: items[%d] is not an object", i)
		}
		objects = append(objects, o)
	}
	return objects, nil
}

func convertNumbers(value any) any {
	switch v := value.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		for k, item := range v {
			v[k] = convertNumbers(item)
		}
	case []any:
		for i, item := range v {
			v[i] = convertNumbers(item)
		}
	}
	return value
}
