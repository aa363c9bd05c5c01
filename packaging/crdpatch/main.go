// Command crdpatch gives every `format: date-time` property of the CRD YAML
// files it is given, that has no pattern of its own, the pattern of the
// RFC 3339 form metav1.Time decodes (time.Parse with time.RFC3339). The API
// server's date-time format alone also takes forms Go refuses (a lowercase
// t or z, no zone, a space for the T, the empty string), and one such value
// stored makes the coordinator's typed read of the kind fail. The date-time
// properties of types from other modules (metav1.Condition's
// lastTransitionTime) take no marker, hence this pass after controller-gen
// (`make generate`). A metav1.MicroTime field carries its own, stricter
// pattern (six fractional digits), which this leaves alone.
package main

import (
	"fmt"
	"os"
	"strings"
)

// TimePattern is what time.Parse(time.RFC3339, s) accepts, narrowed to
// valid field ranges and at most nine fractional digits.
const TimePattern = `^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`

func main() {
	for _, f := range os.Args[1:] {
		if err := patch(f); err != nil {
			fmt.Fprintf(os.Stderr, "crdpatch: %s: %v\n", f, err)
			os.Exit(1)
		}
	}
}

func patch(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	lines := strings.Split(string(data), "\n")
	var out []string
	for i, l := range lines {
		out = append(out, l)
		if strings.TrimSpace(l) != "format: date-time" {
			continue
		}
		indent := l[:len(l)-len(strings.TrimLeft(l, " "))]
		if hasSibling(lines, i, indent, "pattern:") {
			continue
		}
		// controller-gen sorts keys: pattern goes after format (and any
		// key between them, of which a date-time has none).
		out = append(out, indent+"pattern: "+quote(TimePattern))
	}
	return os.WriteFile(file, []byte(strings.Join(out, "\n")), 0o644)
}

// hasSibling: a key at the same indent as lines[i], in the same mapping,
// starts with prefix.
func hasSibling(lines []string, i int, indent, prefix string) bool {
	for _, dir := range []int{-1, 1} {
		for j := i + dir; j >= 0 && j < len(lines); j += dir {
			l := lines[j]
			cur := l[:len(l)-len(strings.TrimLeft(l, " "))]
			if len(cur) < len(indent) || strings.HasPrefix(strings.TrimLeft(l, " "), "- ") && len(cur) == len(indent)-2 {
				break
			}
			if cur == indent && strings.HasPrefix(l[len(cur):], prefix) {
				return true
			}
		}
	}
	return false
}

// quote writes s as a single-quoted YAML scalar, as controller-gen does.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
