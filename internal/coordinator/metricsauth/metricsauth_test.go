package metricsauth

import (
	"net/http"
	"testing"
)

// The token is read as k8s.io/apiserver's bearer-token authenticator reads
// it: the scheme in any case, the token up to the next space, nothing for
// any other scheme or an empty token.
func TestBearerTokenIsReadAsTheAPIServerReadsIt(t *testing.T) {
	for _, c := range []struct {
		name, header, want string
	}{
		{"no header is no token", "", ""},
		{"a bearer token", "Bearer abc", "abc"},
		{"the scheme in any case", "bEaReR abc", "abc"},
		{"surrounding spaces are trimmed", "  Bearer abc  ", "abc"},
		{"what follows a second space is not the token", "Bearer abc def", "abc"},
		{"two spaces before the token is an empty token", "Bearer  abc", ""},
		{"another scheme is no token", "Basic abc", ""},
		{"a scheme alone is no token", "Bearer", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, "https://localhost/metrics", nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.header != "" {
				req.Header.Set("Authorization", c.header)
			}
			if got := bearer(req); got != c.want {
				t.Fatalf("bearer(%q) = %q, want %q", c.header, got, c.want)
			}
		})
	}
}
