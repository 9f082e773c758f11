package main

// How Argo CD evaluates a health check from argocd-cm, mirrored step by step. Sources, all from
// argoproj/argo-cd at commit 37ee0097cf851bc2dd7665fc081bbce61a7e836e (go.mod pins
// github.com/yuin/gopher-lua v1.1.2 and layeh.com/gopher-json v0.0.0-20190114024228-97fed8db8427,
// as go.mod here does):
//
//   util/settings/settings.go   appendResourceOverridesFromSplitKeys, convertToOverrideKey
//   util/lua/lua.go             GetResourceHealth, GetHealthScript, GetConfigMapKey,
//                               runLuaWithResourceActionParameters, ExecuteHealthLua,
//                               isValidHealthStatusCode, decodeValue
//   util/lua/oslib_safe.go      OpenSafeOs, SafeOsLoader: an os with only time and date
//   gitops-engine/pkg/health/health.go  GetResourceHealth: deletion, errors become Unknown
//
// Left out because our argocd-cm patch does not use them: wildcard keys, the legacy
// `resource.customizations` YAML key, built-in scripts (none exist for mtrl.dev) and the
// compiled-script cache (it changes speed, not results).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
)

const invalidHealthStatus = "Lua returned an invalid health status"

// hookFinalizer is gitops-engine's hook.HookFinalizer: an object being deleted that carries it
// still has its health checked.
const hookFinalizer = "argocd.argoproj.io/hook-finalizer"

// override is the health part of Argo CD's ResourceOverride.
type override struct {
	healthLua   string
	useOpenLibs bool
}

// healthStatus is gitops-engine's health.HealthStatus.
type healthStatus struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

// overridesFromConfigMap reads `resource.customizations.<type>.<group_kind>` keys as
// appendResourceOverridesFromSplitKeys does, keeping health and useOpenLibs.
func overridesFromConfigMap(data map[string]string) (map[string]override, error) {
	overrides := map[string]override{}
	for k, v := range data {
		if !strings.HasPrefix(k, "resource.customizations") {
			continue
		}
		parts := strings.SplitN(k, ".", 4)
		if len(parts) < 4 {
			continue
		}
		key, err := convertToOverrideKey(parts[3])
		if err != nil {
			return nil, err
		}
		if key == "all" {
			key = "*/*"
		}
		o := overrides[key]
		switch parts[2] {
		case "health":
			o.healthLua = v
		case "useOpenLibs":
			useOpenLibs, err := strconv.ParseBool(v)
			if err != nil {
				return nil, err
			}
			o.useOpenLibs = useOpenLibs
		case "actions", "ignoreDifferences", "ignoreResourceUpdates", "knownTypeFields":
		default:
			return nil, fmt.Errorf("resource customization type %s not supported", parts[2])
		}
		overrides[key] = o
	}
	return overrides, nil
}

func convertToOverrideKey(groupKind string) (string, error) {
	parts := strings.Split(groupKind, "_")
	if len(parts) == 2 {
		return fmt.Sprintf("%s/%s", parts[0], parts[1]), nil
	} else if len(parts) == 1 && groupKind != "" {
		return groupKind, nil
	}
	return "", fmt.Errorf("group kind should be in format `resource.customizations.<type>.<group_kind>` "+
		"or resource.customizations.<type>.<kind>`, got group kind: '%s'", groupKind)
}

// configMapKey is GetConfigMapKey: "<group>/<kind>", or "<kind>" for the core group.
func configMapKey(obj map[string]any) string {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	group, _, found := strings.Cut(apiVersion, "/")
	if !found {
		group = ""
	}
	if group == "" {
		return kind
	}
	return group + "/" + kind
}

// resourceHealth is gitops-engine's GetResourceHealth with Argo CD's Lua overrides: nil, nil
// when no script applies. On an error Argo CD shows Unknown with the error as the message (and
// logs the returned error).
func resourceHealth(obj map[string]any, overrides map[string]override) (*healthStatus, error) {
	metadata, _ := obj["metadata"].(map[string]any)
	if metadata["deletionTimestamp"] != nil && !hasHookFinalizer(metadata) {
		return &healthStatus{Status: "Progressing", Message: "Pending deletion"}, nil
	}
	o, ok := overrides[configMapKey(obj)]
	if !ok || o.healthLua == "" {
		return nil, nil
	}
	health, err := executeHealthLua(obj, o.healthLua, o.useOpenLibs)
	if err != nil {
		name, _ := metadata["name"].(string)
		namespace, _ := metadata["namespace"].(string)
		return &healthStatus{Status: "Unknown", Message: err.Error()},
			fmt.Errorf("failed to get resource health for %s/%s: %w", namespace, name, err)
	}
	return health, nil
}

func hasHookFinalizer(metadata map[string]any) bool {
	finalizers, _ := metadata["finalizers"].([]any)
	for _, f := range finalizers {
		if f == hookFinalizer {
			return true
		}
	}
	return false
}

// runLua opens the libraries Argo CD opens: everything when useOpenLibs, otherwise only package,
// base, table and the safe os. No string, math or io: `string.format` is an index of nil.
func runLua(obj map[string]any, script string, useOpenLibs bool) (*lua.LState, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: !useOpenLibs})
	for _, pair := range []struct {
		n string
		f lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(pair.f), NRet: 0, Protect: true},
			lua.LString(pair.n)); err != nil {
			panic(err)
		}
	}
	l.PreloadModule(lua.OsLibName, safeOsLoader)

	ctx, cancel := context.WithTimeout(context.Background(), 1*time.Second)
	defer cancel()
	l.SetContext(ctx)

	l.SetGlobal("actionParams", l.CreateTable(0, 0))
	l.SetGlobal("obj", decodeValue(l, obj))

	fn, err := l.LoadString(script)
	if err == nil {
		l.Push(fn)
		err = l.PCall(0, lua.MultRet, nil)
	}
	// Argo CD drops the stack trace of a runtime error: the message is what users see.
	var apiErr *lua.ApiError
	if errors.As(err, &apiErr) && apiErr.Type == lua.ApiErrorRun {
		apiErr.StackTrace = ""
		err = apiErr
	}
	return l, err
}

func executeHealthLua(obj map[string]any, script string, useOpenLibs bool) (*healthStatus, error) {
	l, err := runLua(obj, script, useOpenLibs)
	defer l.Close()
	if err != nil {
		return nil, err
	}
	returnValue := l.Get(-1)
	if returnValue.Type() == lua.LTTable {
		jsonBytes, err := luajson.Encode(returnValue)
		if err != nil {
			return nil, err
		}
		health := &healthStatus{}
		if err := json.Unmarshal(jsonBytes, health); err != nil {
			// Meant for an empty table (encoded as []), but Argo CD's errors.As matches any type
			// mismatch, a number as the message too: all give an empty status.
			var typeError *json.UnmarshalTypeError
			if errors.As(err, &typeError) {
				return &healthStatus{}, nil
			}
			return nil, err
		}
		if !isValidHealthStatusCode(health.Status) {
			return &healthStatus{Status: "Unknown", Message: invalidHealthStatus}, nil
		}
		return health, nil
	} else if returnValue.Type() == lua.LTNil {
		return &healthStatus{}, nil
	}
	return nil, fmt.Errorf("expect %s output from Lua script, not %s", "table", returnValue.Type().String())
}

func isValidHealthStatusCode(status string) bool {
	switch status {
	case "Unknown", "Progressing", "Suspended", "Healthy", "Degraded", "Missing":
		return true
	}
	return false
}

// decodeValue turns the object, as decoded by apimachinery (integers int64, other numbers
// float64), into Lua values: every number becomes an LNumber (a float64).
func decodeValue(l *lua.LState, value any) lua.LValue {
	switch converted := value.(type) {
	case bool:
		return lua.LBool(converted)
	case float64:
		return lua.LNumber(converted)
	case string:
		return lua.LString(converted)
	case json.Number:
		return lua.LString(converted)
	case int:
		return lua.LNumber(converted)
	case int32:
		return lua.LNumber(converted)
	case int64:
		return lua.LNumber(converted)
	case []any:
		arr := l.CreateTable(len(converted), 0)
		for _, item := range converted {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(converted))
		for key, item := range converted {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}

// safeOsFuncs is Argo CD's osFuncs: os.time and os.date only. Argo CD carries copies of
// gopher-lua's two functions; these are the originals, taken from a throwaway state (the
// copies differ only for os.time(nil) and os.date("!...", t), which our checks never call).
var safeOsFuncs = func() map[string]lua.LGFunction {
	l := lua.NewState()
	defer l.Close()
	osLib := l.GetGlobal(lua.OsLibName).(*lua.LTable)
	funcs := map[string]lua.LGFunction{}
	for _, name := range []string{"time", "date"} {
		funcs[name] = osLib.RawGetString(name).(*lua.LFunction).GFunction
	}
	return funcs
}()

func openSafeOs(l *lua.LState) int {
	l.Push(l.RegisterModule(lua.OsLibName, safeOsFuncs))
	return 1
}

func safeOsLoader(l *lua.LState) int {
	l.Push(l.SetFuncs(l.NewTable(), safeOsFuncs))
	return 1
}
