package kubectl

import (
	"strings"
	"testing"
	"time"
)

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 1500 * time.Millisecond: "1s", 59 * time.Second: "59s", time.Minute: "1m",
		100 * time.Second: "1m40s", time.Hour: "1h", 3*time.Hour + 5*time.Minute + 59*time.Second: "3h5m",
		52 * time.Hour: "2d4h", 48 * time.Hour: "2d",
	} {
		if got := age(d); got != want {
			t.Errorf("age(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestBar(t *testing.T) {
	for _, c := range []struct {
		updated, nodes int32
		want           string
	}{{0, 0, "[----------] 0/0"}, {1, 10, "[#---------] 1/10"}, {2, 3, "[######----] 2/3"}, {8, 8, "[##########] 8/8"}, {9, 8, "[##########] 9/8"}} {
		if got := bar(c.updated, c.nodes); got != c.want {
			t.Errorf("bar(%d, %d) = %q, want %q", c.updated, c.nodes, got, c.want)
		}
	}
}

func TestValidReason(t *testing.T) {
	for _, c := range []struct {
		reason string
		ok     bool
	}{
		{"", true}, {"disk replacement, ticket #42", true}, {"Wartung: Lüfter tauschen", true},
		{strings.Repeat("x", MaxHoldReason), true}, {strings.Repeat("x", MaxHoldReason+1), false},
		{"two\nlines", false}, {"tab\there", false}, {"bell\a", false}, {"bad \xff utf-8", false},
	} {
		if err := validReason(c.reason); (err == nil) != c.ok {
			t.Errorf("validReason(%q) = %v, want ok %t", c.reason, err, c.ok)
		}
	}
}
