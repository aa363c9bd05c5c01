package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"regexp/syntax"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// TestSchemaAcceptsOnlyWhatDecodes walks every property of both CRDs'
// OpenAPI schemas (read from the generated YAML in packaging/crd), generates
// boundary, awkward and seeded random values for each from its type, format,
// pattern and bounds, and asks the real API server whether it accepts them
// (a server-side dry run, so CEL rules and patterns are the server's own
// verdict). Every value the server accepts must decode with the typed
// scheme, through the JSON codec the coordinator's client decodes with: an
// object the server stores but the coordinator cannot decode stalls its
// typed list of that kind (issue 26). A property the walker does not reach,
// or one for which the server accepted no value at all, fails the test, so
// a new field needs no new code here to be covered.
//
// BOOTC_FLEET_SCHEMA_SEED replays a seed the test printed on failure.
func TestSchemaAcceptsOnlyWhatDecodes(t *testing.T) {
	ctx, c := needEnv(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("BOOTC_FLEET_SCHEMA_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("BOOTC_FLEET_SCHEMA_SEED: %v", err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random part's seed: BOOTC_FLEET_SCHEMA_SEED=%d", seed)
		}
	})
	for _, k := range []struct {
		file, kind string
		spec       map[string]any
		into       func() k8sruntime.Object
	}{
		{"fleet.bootc.dev_bootcnodepools.yaml", "BootcNodePool", map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"pool": "schema"}},
			"image":        "quay.io/example/os:42",
			// A workloads check needs a non-empty pod selector (a CEL rule)
			// before any of its other fields can be stored.
			"health": map[string]any{"workloads": map[string]any{
				"podSelector": map[string]any{"matchLabels": map[string]any{"app": "schema"}},
			}},
		}, func() k8sruntime.Object { return &fleetv1.BootcNodePool{} }},
		{"fleet.bootc.dev_bootcnodes.yaml", "BootcNode", map[string]any{"pool": "schema"},
			func() k8sruntime.Object { return &fleetv1.BootcNode{} }},
	} {
		t.Run(k.kind, func(t *testing.T) {
			w := newSchemaWalker(t, ctx, c, k.file, k.kind, k.spec, k.into, seed)
			w.run()
		})
	}
}

// decodeTyped decodes data as the coordinator's client does: the scheme's
// JSON serializer (case-sensitive, not strict, no conversion or defaulting).
func decodeTyped(data []byte, into k8sruntime.Object) error {
	s := k8sruntime.NewScheme()
	if err := fleetv1.AddToScheme(s); err != nil {
		return err
	}
	_, _, err := serializer.NewCodecFactory(s).UniversalDeserializer().Decode(data, nil, into)
	return err
}

type schemaWalker struct {
	t        *testing.T
	ctx      context.Context
	c        client.Client
	kind     string
	schema   *apiextensionsv1.JSONSchemaProps
	baseSpec map[string]any
	into     func() k8sruntime.Object
	rng      *rand.Rand
	live     *unstructured.Unstructured // the stored object status values go on
	n        int

	visited  map[string]bool
	accepted map[string]int
	tried    int
	failed   map[string][]string // path -> values accepted but undecodable
}

func newSchemaWalker(t *testing.T, ctx context.Context, c client.Client, file, kind string, spec map[string]any, into func() k8sruntime.Object, seed uint64) *schemaWalker {
	data, err := os.ReadFile(filepath.Join(envtest.CRDDir(), file))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		t.Fatalf("%s: want one version with a schema", file)
	}
	return &schemaWalker{t: t, ctx: ctx, c: c, kind: kind, schema: crd.Spec.Versions[0].Schema.OpenAPIV3Schema,
		baseSpec: spec, into: into, rng: rand.New(rand.NewPCG(seed, uint64(len(kind)))),
		visited: map[string]bool{}, accepted: map[string]int{}, failed: map[string][]string{}}
}

func (w *schemaWalker) run() {
	t := w.t
	props := w.schema.Properties
	// The stored object whose status the status values are tried on.
	w.live = w.object("schema-live")
	w.live.Object["spec"] = w.baseSpec
	if err := w.c.Create(w.ctx, w.live); err != nil {
		t.Fatalf("creating the base %s: %v", w.kind, err)
	}
	t.Cleanup(func() { _ = w.c.Delete(context.Background(), w.live) })

	for _, top := range []string{"spec", "status"} {
		s := props[top]
		w.walk(&s, top, []string{top})
	}
	// Seeded random values at random properties.
	leaves := w.leaves()
	for range 250 {
		l := leaves[w.rng.IntN(len(leaves))]
		w.try(l.path, l.segs, randomValue(l.schema, w.rng))
	}

	all := map[string]bool{}
	for _, top := range []string{"spec", "status"} {
		s := props[top]
		schemaPaths(&s, top, all)
	}
	var missed, none []string
	for p := range all {
		if !w.visited[p] {
			missed = append(missed, p)
		}
	}
	for p := range w.visited {
		if w.accepted[p] == 0 && isLeafPath(w.schema, p) {
			none = append(none, p)
		}
	}
	sort.Strings(missed)
	sort.Strings(none)
	if len(missed) > 0 {
		t.Errorf("properties the walker never reached: %v", missed)
	}
	if len(none) > 0 {
		t.Errorf("properties for which the API server accepted no generated value (the generator's base is wrong): %v", none)
	}
	var bad []string
	for p := range w.failed {
		bad = append(bad, p)
	}
	sort.Strings(bad)
	for _, p := range bad {
		t.Errorf("%s: the API server accepts values the typed decoder refuses: %s", p, strings.Join(w.failed[p], "; "))
	}
	t.Logf("%s: %d properties, %d values tried, %d accepted paths, undecodable at: %v", w.kind, len(all), w.tried, len(w.accepted), bad)
}

func (w *schemaWalker) object(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": fleetv1.GroupVersion.String(),
		"kind":       w.kind,
		"metadata":   map[string]any{"name": name},
	}}
}

type leaf struct {
	path   string
	segs   []string
	schema *apiextensionsv1.JSONSchemaProps
}

func (w *schemaWalker) leaves() []leaf {
	var out []leaf
	var rec func(s *apiextensionsv1.JSONSchemaProps, path string, segs []string)
	rec = func(s *apiextensionsv1.JSONSchemaProps, path string, segs []string) {
		switch {
		case s.Type == "object" && len(s.Properties) > 0:
			for _, name := range sortedKeys(s.Properties) {
				p := s.Properties[name]
				rec(&p, path+"."+name, append(append([]string{}, segs...), name))
			}
		case s.Type == "object" && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
			rec(s.AdditionalProperties.Schema, path+"{}", append(append([]string{}, segs...), "{}"))
		case s.Type == "array" && s.Items != nil && s.Items.Schema != nil:
			rec(s.Items.Schema, path+"[]", append(append([]string{}, segs...), "[]"))
		default:
			out = append(out, leaf{path, segs, s})
		}
	}
	for _, top := range []string{"spec", "status"} {
		s := w.schema.Properties[top]
		rec(&s, top, []string{top})
	}
	return out
}

// walk tries every candidate value at each leaf under s.
func (w *schemaWalker) walk(s *apiextensionsv1.JSONSchemaProps, path string, segs []string) {
	w.visited[path] = true
	switch {
	case s.Type == "object" && len(s.Properties) > 0:
		for _, name := range sortedKeys(s.Properties) {
			p := s.Properties[name]
			w.walk(&p, path+"."+name, append(append([]string{}, segs...), name))
		}
		return
	case s.Type == "object" && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
		w.walk(s.AdditionalProperties.Schema, path+"{}", append(append([]string{}, segs...), "{}"))
		return
	case s.Type == "array" && s.Items != nil && s.Items.Schema != nil:
		w.walk(s.Items.Schema, path+"[]", append(append([]string{}, segs...), "[]"))
		return
	}
	for _, v := range candidates(s, w.rng) {
		w.try(path, segs, v)
	}
}

// try puts v at segs in a valid base object and, if the API server accepts
// the result, decodes what it would store.
func (w *schemaWalker) try(path string, segs []string, v any) {
	t := w.t
	w.tried++
	w.n++
	var got client.Object
	var err error
	if segs[0] == "spec" {
		u := w.object(fmt.Sprintf("schema-%d", w.n))
		spec := deepCopyJSON(w.baseSpec).(map[string]any)
		u.Object["spec"] = spec
		w.set(u.Object, segs, v, w.schema)
		err = w.c.Create(w.ctx, u, client.DryRunAll)
		got = u
	} else {
		u := w.live.DeepCopy()
		u.Object["status"] = w.baseValue(w.prop("status"), "status")
		w.set(u.Object, segs, v, w.schema)
		err = w.c.Status().Update(w.ctx, u, client.DryRunAll)
		got = u
	}
	if err != nil {
		if w.ctx.Err() != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return // refused: nothing to decode
	}
	w.accepted[path]++
	data, err := json.Marshal(got.(*unstructured.Unstructured).Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeTyped(data, w.into()); err != nil {
		shown, _ := json.Marshal(v)
		w.failed[path] = append(w.failed[path], fmt.Sprintf("%s (%v)", shorten(string(shown)), err))
	}
}

// shorten cuts a long value for a failure message, saying how long it was.
func shorten(s string) string {
	if n := utf8.RuneCountInString(s); n > 40 {
		return fmt.Sprintf("%s(%d chars)", text.Truncate(s, 24), n)
	}
	return s
}

func (w *schemaWalker) prop(name string) *apiextensionsv1.JSONSchemaProps {
	p := w.schema.Properties[name]
	return &p
}

// set puts v at segs in obj, building what is missing on the way from valid
// base values (an array gets one element, a map one key).
func (w *schemaWalker) set(obj map[string]any, segs []string, v any, s *apiextensionsv1.JSONSchemaProps) {
	var cur any = obj
	for i, seg := range segs {
		last := i == len(segs)-1
		switch seg {
		case "[]":
			s = s.Items.Schema
		case "{}":
			s = s.AdditionalProperties.Schema
		default:
			p := s.Properties[seg]
			s = &p
		}
		switch c := cur.(type) {
		case map[string]any:
			key := seg
			if seg == "{}" {
				key = "example.com/key"
			}
			if last {
				c[key] = v
				return
			}
			if _, ok := c[key]; !ok {
				c[key] = w.baseValue(s, strings.Join(segs[:i+1], "."))
			}
			cur = c[key]
		case []any:
			if last {
				c[0] = v
				return
			}
			cur = c[0]
		}
	}
}

// baseValue is a value s accepts: its default, or one built from its type,
// enum, pattern and bounds (every required property set).
func (w *schemaWalker) baseValue(s *apiextensionsv1.JSONSchemaProps, path string) any {
	if s.Default != nil {
		var v any
		if err := json.Unmarshal(s.Default.Raw, &v); err == nil {
			return v
		}
	}
	switch {
	case s.XIntOrString:
		return int64(1)
	case s.Type == "object":
		m := map[string]any{}
		for _, r := range s.Required {
			p := s.Properties[r]
			m[r] = w.baseValue(&p, path+"."+r)
		}
		return m
	case s.Type == "array":
		return []any{w.baseValue(s.Items.Schema, path+"[]")}
	case s.Type == "integer":
		v := int64(1)
		if s.Minimum != nil {
			v = int64(*s.Minimum)
		}
		return v
	case s.Type == "boolean":
		return true
	case s.Type == "string":
		for _, e := range s.Enum {
			var v string
			if json.Unmarshal(e.Raw, &v) == nil && v != "" {
				return v
			}
		}
		if s.Format == "date-time" {
			return "2024-01-01T12:00:00.000000Z"
		}
		if isDuration(s) {
			return "1h"
		}
		if s.Pattern != "" {
			for range 200 {
				if v, ok := fromPattern(s.Pattern, w.rng, maxLen(s)); ok && v != "" {
					return v
				}
			}
			w.t.Fatalf("%s: no value generated for pattern %s", path, s.Pattern)
		}
		return strings.Repeat("a", max(1, int(ptrOr(s.MinLength, 1))))
	}
	w.t.Fatalf("%s: no base value for a schema of type %q", path, s.Type)
	return nil
}

func isDuration(s *apiextensionsv1.JSONSchemaProps) bool {
	for _, r := range s.XValidations {
		if strings.Contains(r.Rule, "duration(self)") {
			return true
		}
	}
	return false
}

func maxLen(s *apiextensionsv1.JSONSchemaProps) int { return int(ptrOr(s.MaxLength, 64)) }

func ptrOr(p *int64, d int64) int64 {
	if p == nil {
		return d
	}
	return *p
}

// candidates are the boundary and awkward values tried at a leaf of schema
// s, plus a few random ones.
func candidates(s *apiextensionsv1.JSONSchemaProps, rng *rand.Rand) []any {
	var out []any
	ints := []int64{0, 1, -1, 2, 100, math.MaxInt32, math.MaxInt32 + 1, math.MinInt32, math.MinInt32 - 1,
		3000000000, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64, math.MinInt64}
	if s.Minimum != nil {
		ints = append(ints, int64(*s.Minimum), int64(*s.Minimum)-1)
	}
	if s.Maximum != nil {
		ints = append(ints, int64(*s.Maximum), int64(*s.Maximum)+1)
	}
	switch {
	case s.XIntOrString:
		for _, i := range ints {
			out = append(out, i)
		}
		out = append(out, 1.5, "1%", "100%", "101%", "0%", "50%", "99%", "1", "2147483648", "3000000000%", "abc", "", " 1%", "１%")
	case s.Type == "integer":
		for _, i := range ints {
			out = append(out, i)
		}
		out = append(out, 1.5, 1e20, "1")
	case s.Type == "boolean":
		out = append(out, true, false, "true")
	case s.Type == "string" && s.Format == "date-time":
		out = append(out, dateTimes()...)
	case s.Type == "string" && isDuration(s):
		out = append(out, "0s", "1ns", "1us", "1µs", "1.5h", "1h30m", "-1s", "168h", "168h0m0.000000001s", "2562047h",
			"2562047h47m16.854775807s", "2562047h47m16.854775808s", "3000000h", "87600000h", "1d", "1", "", "P1D", "1H")
	case s.Type == "string" && len(s.Enum) > 0:
		for _, e := range s.Enum {
			var v string
			if json.Unmarshal(e.Raw, &v) == nil {
				out = append(out, v)
			}
		}
		out = append(out, "Bogus", "")
	case s.Type == "string":
		n := maxLen(s)
		out = append(out, "", "a", strings.Repeat("a", n), strings.Repeat("a", n+1), strings.Repeat("日", n),
			strings.Repeat("😀", n), "a\u0000b", "\u00e9t\u00e9")
		if s.Pattern != "" {
			for range 6 {
				if v, ok := fromPattern(s.Pattern, rng, n); ok {
					out = append(out, v)
				}
			}
		}
	}
	for range 3 {
		out = append(out, randomValue(s, rng))
	}
	return out
}

// dateTimes are RFC 3339 forms and near misses: every count of fractional
// digits, offsets, lowercase letters, no zone, leap seconds.
func dateTimes() []any {
	out := []any{"2024-01-01T12:00:00Z", "2024-01-01t12:00:00z", "2024-01-01t12:00:00Z", "2024-01-01T12:00:00z",
		"2024-01-01T12:00:00+02:00", "2024-01-01T12:00:00-07:30", "2024-01-01T12:00:00.000000+02:00",
		"2024-01-01T12:00:00+0200", "2024-01-01T12:00:00", "2024-01-01 12:00:00Z", "2024-01-01", "2024-02-30T12:00:00Z",
		"2024-12-31T23:59:60Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "2024-01-01T12:00:00.Z",
		"2024-01-01T12:00:00+24:00", "2024-01-01T12:00:00+23:59", "2024-01-01T12:00:00.000000+00:60", "2024-01-01T24:00:00Z", "",
		"not a time", "2024-01-01T12:00:00.000000000000Z"}
	for d := 1; d <= 10; d++ {
		out = append(out, "2024-01-01T12:00:00."+strings.Repeat("1", d)+"Z")
	}
	return out
}

// randomValue draws a value of s's type (or near it) at random.
func randomValue(s *apiextensionsv1.JSONSchemaProps, rng *rand.Rand) any {
	switch {
	case s.XIntOrString:
		if rng.IntN(2) == 0 {
			return randomInt(rng)
		}
		return strconv.Itoa(rng.IntN(130)) + "%"
	case s.Type == "integer":
		return randomInt(rng)
	case s.Type == "boolean":
		return rng.IntN(2) == 0
	case s.Type == "string" && s.Format == "date-time":
		return randomDateTime(rng)
	case s.Type == "string" && isDuration(s):
		units := []string{"ns", "us", "µs", "ms", "s", "m", "h"}
		return strconv.FormatInt(rng.Int64N(1<<uint(rng.IntN(40)+1)), 10) + units[rng.IntN(len(units))]
	case s.Type == "string" && len(s.Enum) > 0:
		var v string
		_ = json.Unmarshal(s.Enum[rng.IntN(len(s.Enum))].Raw, &v)
		return v
	case s.Type == "string":
		if s.Pattern != "" && rng.IntN(2) == 0 {
			if v, ok := fromPattern(s.Pattern, rng, maxLen(s)); ok {
				return v
			}
		}
		return randomString(rng, rng.IntN(maxLen(s)+2))
	}
	return nil
}

func randomInt(rng *rand.Rand) int64 {
	v := rng.Int64N(1 << uint(rng.IntN(62)+1))
	if rng.IntN(4) == 0 {
		v = -v
	}
	return v
}

func randomDateTime(rng *rand.Rand) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%04d-%02d-%02d", rng.IntN(10000), rng.IntN(14), rng.IntN(33))
	b.WriteString([]string{"T", "t", " "}[rng.IntN(3)])
	fmt.Fprintf(&b, "%02d:%02d:%02d", rng.IntN(25), rng.IntN(61), rng.IntN(61))
	if d := rng.IntN(11); d > 0 {
		b.WriteString(".")
		for range d {
			b.WriteByte(byte('0' + rng.IntN(10)))
		}
	}
	switch rng.IntN(5) {
	case 0:
		b.WriteString("Z")
	case 1:
		b.WriteString("z")
	case 2:
		fmt.Fprintf(&b, "%c%02d:%02d", "+-"[rng.IntN(2)], rng.IntN(26), rng.IntN(61))
	case 3:
		fmt.Fprintf(&b, "%c%02d%02d", "+-"[rng.IntN(2)], rng.IntN(24), rng.IntN(60))
	}
	return b.String()
}

func randomString(rng *rand.Rand, n int) string {
	pool := []rune("aZ09-_./:@%é日😀\u0000\n\"\\ ")
	r := make([]rune, n)
	for i := range r {
		r[i] = pool[rng.IntN(len(pool))]
	}
	return string(r)
}

// fromPattern generates a string matching the regular expression pattern
// (RE2, as the API server reads it) of at most maxLen characters.
func fromPattern(pattern string, rng *rand.Rand, maxLen int) (string, bool) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return "", false
	}
	re = re.Simplify()
	check := regexp.MustCompile(pattern)
	for range 20 {
		var b strings.Builder
		genRegexp(re, rng, &b)
		if v := b.String(); check.MatchString(v) && len([]rune(v)) <= maxLen {
			return v, true
		}
	}
	return "", false
}

func genRegexp(re *syntax.Regexp, rng *rand.Rand, b *strings.Builder) {
	repeat := func(lo, hi int) {
		if hi < 0 {
			hi = lo + 3
		}
		for range lo + rng.IntN(hi-lo+1) {
			genRegexp(re.Sub[0], rng, b)
		}
	}
	switch re.Op {
	case syntax.OpLiteral:
		b.WriteString(string(re.Rune))
	case syntax.OpCharClass:
		i := rng.IntN(len(re.Rune)/2) * 2
		lo, hi := re.Rune[i], re.Rune[i+1]
		if hi-lo > 200 {
			hi = lo + 200
		}
		b.WriteRune(lo + rune(rng.IntN(int(hi-lo)+1)))
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		b.WriteRune('a')
	case syntax.OpCapture:
		genRegexp(re.Sub[0], rng, b)
	case syntax.OpStar:
		repeat(0, 3)
	case syntax.OpPlus:
		repeat(1, 4)
	case syntax.OpQuest:
		repeat(0, 1)
	case syntax.OpRepeat:
		repeat(re.Min, re.Max)
	case syntax.OpConcat:
		for _, s := range re.Sub {
			genRegexp(s, rng, b)
		}
	case syntax.OpAlternate:
		genRegexp(re.Sub[rng.IntN(len(re.Sub))], rng, b)
	}
}

// schemaPaths lists every property path under s, independently of the
// walker, so a property the walker skips fails the test.
func schemaPaths(s *apiextensionsv1.JSONSchemaProps, path string, out map[string]bool) {
	out[path] = true
	for name, p := range s.Properties {
		schemaPaths(&p, path+"."+name, out)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		schemaPaths(s.AdditionalProperties.Schema, path+"{}", out)
	}
	if s.Items != nil && s.Items.Schema != nil {
		schemaPaths(s.Items.Schema, path+"[]", out)
	}
}

// isLeafPath: the schema at path holds values (no properties, items or
// additional properties of its own).
func isLeafPath(root *apiextensionsv1.JSONSchemaProps, path string) bool {
	s := root
	for _, seg := range splitPath(path) {
		switch seg {
		case "[]":
			s = s.Items.Schema
		case "{}":
			s = s.AdditionalProperties.Schema
		default:
			p := s.Properties[seg]
			s = &p
		}
	}
	return len(s.Properties) == 0 && s.Items == nil && (s.AdditionalProperties == nil || s.AdditionalProperties.Schema == nil)
}

func splitPath(path string) []string {
	var out []string
	for _, part := range strings.Split(path, ".") {
		for {
			if i := strings.IndexAny(part, "[{"); i >= 0 {
				if i > 0 {
					out = append(out, part[:i])
				}
				out = append(out, part[i:i+2])
				part = part[i+2:]
				continue
			}
			break
		}
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

func sortedKeys(m map[string]apiextensionsv1.JSONSchemaProps) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func deepCopyJSON(v any) any {
	switch t := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[k] = deepCopyJSON(x)
		}
		return m
	case []any:
		s := make([]any, len(t))
		for i, x := range t {
			s[i] = deepCopyJSON(x)
		}
		return s
	default:
		return v
	}
}
