package imageref

import (
	"errors"
	"strings"
	"testing"
)

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestValidateWithHost(t *testing.T) {
	for ref, ok := range map[string]bool{
		"quay.io/fedora/fedora-bootc:42":          true,
		"localhost/os:1":                          true,
		"localhost:5000/os:1":                     true,
		"127.0.0.1:5000/fleet/os@sha256:" + hex64: true,
		"registry:5000/os:1":                      true,
		"fedora/fedora-bootc:42":                  false,
		"os:1":                                    false,
		"library/os@sha256:" + hex64:              false,
	} {
		err := ValidateWithHost(ref)
		if (err == nil) != ok {
			t.Errorf("ValidateWithHost(%q) = %v, want ok %v", ref, err, ok)
		}
		if !ok && (!errors.Is(err, ErrNoRegistryHost) || !strings.Contains(err.Error(), "write the registry host")) {
			t.Errorf("ValidateWithHost(%q) = %v, want ErrNoRegistryHost saying to write the host", ref, err)
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name, ref string
		ok        bool
	}{
		{"tag", "quay.io/example/os:42", true},
		{"digest", "quay.io/example/os@sha256:" + hex64, true},
		{"tag and digest", "quay.io/example/os:42@sha256:" + hex64, true},
		{"registry with port", "localhost:5000/os:latest", true},
		{"no registry", "fedora/fedora-bootc:42", true},
		{"single component", "os:1", true},
		{"untagged", "quay.io/example/os", false},
		{"port but untagged", "localhost:5000/os", false},
		{"empty", "", false},
		{"space", "quay.io/example/os :42", false},
		{"shell semicolon", "quay.io/os:42;reboot", false},
		{"shell substitution", "quay.io/$(id)/os:1", false},
		{"backtick", "quay.io/os:`id`", false},
		{"leading dash (option injection)", "-quay.io/os:1", false},
		{"uppercase repo", "quay.io/Example/os:1", false},
		{"short digest", "quay.io/os@sha256:abc", false},
		{"uppercase digest", "quay.io/os@sha256:" + strings.ToUpper(hex64), false},
		{"other algorithm", "quay.io/os@sha512:" + hex64, false},
		{"newline", "quay.io/os:1\n", false},
		{"too long", "quay.io/" + strings.Repeat("a", MaxLength) + ":1", false},
		{"tag too long", "quay.io/os:" + strings.Repeat("a", 129), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Validate(c.ref)
			if (err == nil) != c.ok {
				t.Fatalf("Validate(%q) = %v, want ok=%v", c.ref, err, c.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestParsePinned(t *testing.T) {
	p, err := ParsePinned("localhost:5000/a/b@sha256:" + hex64)
	if err != nil {
		t.Fatal(err)
	}
	if p.Repository != "localhost:5000/a/b" || p.Digest != "sha256:"+hex64 {
		t.Fatalf("got %+v", p)
	}
	if p.String() != "localhost:5000/a/b@sha256:"+hex64 {
		t.Fatalf("String() = %q", p.String())
	}
	for _, bad := range []string{"q.io/os:1", "q.io/os:1@sha256:" + hex64, "q.io/os@sha256:" + hex64 + " ", ""} {
		if _, err := ParsePinned(bad); err == nil {
			t.Errorf("ParsePinned(%q) accepted", bad)
		}
	}
}

func TestRepository(t *testing.T) {
	cases := map[string]string{
		"localhost:5000/os:1":               "localhost:5000/os",
		"localhost:5000/os@sha256:" + hex64: "localhost:5000/os",
		"quay.io/a/os:1@sha256:" + hex64:    "quay.io/a/os",
		"os:latest":                         "os",
	}
	for in, want := range cases {
		got, err := Repository(in)
		if err != nil || got != want {
			t.Errorf("Repository(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	p, err := PinnedFromDigest("localhost:5000/os:1", "sha256:"+hex64)
	if err != nil || p.String() != "localhost:5000/os@sha256:"+hex64 {
		t.Fatalf("PinnedFromDigest = %v, %v", p, err)
	}
	if _, err := PinnedFromDigest("localhost:5000/os:1", "sha256:zz"); err == nil {
		t.Fatal("PinnedFromDigest accepted a bad digest")
	}
}

func FuzzValidate(f *testing.F) {
	for _, s := range []string{"quay.io/os:1", "a@sha256:" + hex64, "x y", "localhost:5000/os:1@sha256:" + hex64} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Validate(s) != nil {
			if _, err := ParsePinned(s); err == nil {
				t.Fatalf("ParsePinned accepted %q that Validate rejects", s)
			}
			return
		}
		// Whatever validates is safe as one argv element and never an option.
		if strings.ContainsAny(s, " \t\n\r;&|$`'\"\\<>(){}*?!~#") || strings.HasPrefix(s, "-") {
			t.Fatalf("Validate accepted unsafe %q", s)
		}
		if p, err := ParsePinned(s); err == nil && p.String() != s {
			t.Fatalf("round trip %q -> %q", s, p.String())
		}
	})
}
