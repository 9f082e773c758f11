// Command dashboardcheck validates Grafana dashboard JSON files (the classic dashboard model that
// Grafana's provisioning and the Grafana chart's dashboard sidecar load) against Grafana's own
// schema, parses every Prometheus query with Prometheus's own PromQL parser, and reports the
// series each query selects, so that a test can hold them against the metrics the operator
// exports.
//
//	dashboardcheck charts/mtrl-operator/dashboards/*.json
//
// The schema is grafana-foundation-sdk's Go types (github.com/grafana/grafana-foundation-sdk/go,
// Apache-2.0), which Grafana Labs generates with cog from the CUE kinds in the Grafana
// repository: the dashboard kind and each panel plugin's and data source's panelcfg/dataquery
// schema. Their UnmarshalJSONStrict rejects unknown fields, values of the wrong JSON type and
// missing required fields; Validate checks the schema's constraints (gridPos within 24 columns,
// h > 0, ...). Gaps of that decoder are closed here: a panel type or data source it has no schema
// for is decoded loosely, so both must be known; enums are not checked, so variable types are; and
// the Validate of panels and queries is run on each (see rawPanel).
//
// PromQL is parsed by github.com/prometheus/prometheus/promql/parser, after Grafana's
// interpolation is imitated: $__rate_interval and the other $__ macros become a duration, $var
// and ${var} a plain word (the dashboard uses variables only inside label values).
//
// It prints one JSON object: {"problems": ["<file>: <path>: <message>", ...], "queries": [{"file",
// "at", "expr", "selectors": [{"metric", "labels"}]}]}, where labels are the label names a
// selector must have (see selectors). The exit status is 1 if any problem was found.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// The dashboard kind's VariableType enum.
var variableTypes = map[dashboard.VariableType]bool{
	dashboard.VariableTypeQuery: true, dashboard.VariableTypeAdhoc: true,
	dashboard.VariableTypeGroupby: true, dashboard.VariableTypeConstant: true,
	dashboard.VariableTypeDatasource: true, dashboard.VariableTypeInterval: true,
	dashboard.VariableTypeTextbox: true, dashboard.VariableTypeCustom: true,
	dashboard.VariableTypeSystem: true, dashboard.VariableTypeSnapshot: true,
	dashboard.VariableTypeSwitch: true,
}

var (
	grafanaMacro    = regexp.MustCompile(`\$\{?__[a-z_]+\}?`)
	grafanaVariable = regexp.MustCompile(`\$\{[A-Za-z0-9_]+(:[a-z]+)?\}|\$[A-Za-z0-9_]+|\[\[[A-Za-z0-9_]+\]\]`)
	// The Prometheus data source's own variable query function, label_values(metric, label).
	labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
	promql      = parser.NewParser(parser.Options{})
)

type selector struct {
	Metric string   `json:"metric"`
	Labels []string `json:"labels"`
}

type query struct {
	File      string     `json:"file"`
	At        string     `json:"at"`
	Expr      string     `json:"expr"`
	Selectors []selector `json:"selectors"`
}

type report struct {
	Problems []string `json:"problems"`
	Queries  []query  `json:"queries"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboardcheck DASHBOARD.json...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	out := report{Problems: []string{}, Queries: []query{}}
	for _, path := range os.Args[1:] {
		if err := check(path, &out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if len(out.Problems) > 0 {
		os.Exit(1)
	}
}

// rawPanel and rawBoard are the parts of a dashboard that the checks below walk. The SDK's own
// decoded Dashboard cannot be walked: its union and variant decoders (PanelOrRowPanel, each
// dataquery, StringOrMap) return a typed-nil cog.BuildErrors on success, which their callers take
// for a failure, so decoded panels and targets are left empty. The errors they collect are
// complete all the same, so strict decoding is done once on the whole dashboard, and the pieces
// are decoded again here only to run their Validate and the checks the schema lacks.
type rawPanel struct {
	Type       string            `json:"type"`
	Datasource *rawDatasource    `json:"datasource"`
	Targets    []json.RawMessage `json:"targets"`
	Panels     []json.RawMessage `json:"panels"`
}

type rawDatasource struct {
	Type string `json:"type"`
}

type rawBoard struct {
	Panels     []json.RawMessage `json:"panels"`
	Templating struct {
		List []struct {
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func check(path string, out *report) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	problem := func(at string, err error) {
		var errs cog.BuildErrors
		if errors.As(err, &errs) {
			for _, e := range errs {
				out.Problems = append(out.Problems, fmt.Sprintf("%s: %s%s", path, at, e))
			}
		} else if err != nil {
			out.Problems = append(out.Problems, fmt.Sprintf("%s: %s%s", path, at, err))
		}
	}
	addQuery := func(at, expr string, promQL bool) {
		sels, err := selectors(expr, promQL)
		if err != nil {
			problem(at+": ", err)
			return
		}
		out.Queries = append(out.Queries, query{File: path, At: at, Expr: expr, Selectors: sels})
	}

	var board dashboard.Dashboard
	problem("", board.UnmarshalJSONStrict(raw))
	problem("", board.Validate())

	var walked rawBoard
	if err := json.Unmarshal(raw, &walked); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for i, top := range walked.Panels {
		where := "panels[" + strconv.Itoa(i) + "]"
		var head rawPanel
		if err := json.Unmarshal(top, &head); err != nil {
			problem(where+": ", err)
			continue
		}
		members := []json.RawMessage{top}
		if head.Type == "row" {
			var row dashboard.RowPanel
			_ = row.UnmarshalJSONStrict(top) // its errors are the dashboard's, reported above
			problem(where+".", row.Validate())
			members = head.Panels
		}
		for k, member := range members {
			at := where
			if head.Type == "row" {
				at = fmt.Sprintf("%s.panels[%d]", where, k)
			}
			checkPanel(at, member, problem, addQuery)
		}
	}
	for i, v := range walked.Templating.List {
		at := fmt.Sprintf("templating.list[%d]", i)
		if !variableTypes[dashboard.VariableType(v.Type)] {
			problem(at+".type: ", fmt.Errorf("unknown variable type %q", v.Type))
		}
		if dashboard.VariableType(v.Type) != dashboard.VariableTypeQuery {
			continue
		}
		var expr string
		var editor struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &expr) != nil {
			if err := json.Unmarshal(v.Query, &editor); err != nil {
				problem(at+".query: ", err)
				continue
			}
			expr = editor.Query
		}
		addQuery(at+".query", expr, false)
	}
	return nil
}

func checkPanel(at string, raw json.RawMessage, problem func(string, error),
	addQuery func(string, string, bool)) {
	var head rawPanel
	if err := json.Unmarshal(raw, &head); err != nil {
		problem(at+": ", err)
		return
	}
	var panel dashboard.Panel
	_ = panel.UnmarshalJSONStrict(raw) // its errors are the dashboard's, reported above
	problem(at+".", panel.Validate())
	if head.Type == "row" {
		problem(at+": ", errors.New("a row inside a row"))
	} else if _, known := cog.ConfigForPanelcfgVariant(head.Type); !known {
		problem(at+": ", fmt.Errorf("no schema for panel type %q", head.Type))
	}
	for j, target := range head.Targets {
		where := fmt.Sprintf("%s.targets[%d]", at, j)
		var q prometheus.Dataquery
		_ = q.UnmarshalJSONStrict(target) // its errors are the dashboard's, reported above
		problem(where+".", q.Validate())
		datasource := head.Datasource
		if q.Datasource != nil && q.Datasource.Type != nil {
			datasource = &rawDatasource{Type: *q.Datasource.Type}
		}
		if datasource == nil || datasource.Type != "prometheus" {
			problem(where+": ", errors.New("not a Prometheus query: its datasource's type must be prometheus"))
			continue
		}
		addQuery(where, q.Expr, true)
	}
}

// selectors parses a panel's PromQL (promQL) or a variable's query (label_values(...) or PromQL)
// and returns the series selectors in it, each with the labels it is expected to have: those it
// matches on, those an enclosing `by (...)` groups by, and the label label_values asks for.
func selectors(expr string, promQL bool) ([]selector, error) {
	var asked []string
	if !promQL {
		if m := labelValues.FindStringSubmatch(expr); m != nil {
			expr, asked = m[1], []string{m[2]}
		}
	}
	expr = grafanaMacro.ReplaceAllString(expr, "5m")
	expr = grafanaVariable.ReplaceAllString(expr, "grafana_variable")
	ast, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	found := []selector{}
	parser.Inspect(ast, func(node parser.Node, path []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		names := map[string]bool{}
		for _, name := range asked {
			names[name] = true
		}
		for _, m := range vs.LabelMatchers {
			if m.Name != labels.MetricName {
				names[m.Name] = true
			}
		}
		for _, ancestor := range path {
			if agg, ok := ancestor.(*parser.AggregateExpr); ok && !agg.Without {
				for _, name := range agg.Grouping {
					names[name] = true
				}
			}
		}
		sel := selector{Metric: vs.Name, Labels: []string{}}
		for name := range names {
			sel.Labels = append(sel.Labels, name)
		}
		sort.Strings(sel.Labels)
		found = append(found, sel)
		return nil
	})
	return found, nil
}
