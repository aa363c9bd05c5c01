package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/text"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// freeAddr is a loopback address nothing listens on (the metrics server
// takes an address, not a listener).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// /metrics is served over HTTPS to callers the API server authenticates and
// authorizes, with only the packaged RBAC granted to the coordinator: no
// token gets 401, a ServiceAccount without the metrics-reader role 403, one
// bound to it the metrics.
func TestMetricsNeedAuthenticationAndAuthorization(t *testing.T) {
	ctx := context.Background()
	root := envtest.RepoRoot()
	if err := envtest.Apply(ctx, env.Client, filepath.Join(root, "packaging/rbac/coordinator.yaml")); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.AddUser("system:serviceaccount:bootc-fleet-system:bootc-fleet-coordinator", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		t.Helper()
		_, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, stranger := token("metrics-scraper"), token("metrics-stranger")
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-scraper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "bootc-fleet-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "metrics-scraper", Namespace: "default"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	startCoordinatorAs(t, cfg, "metrics", func(o *controller.Options) {
		o.MetricsBindAddress = addr
		o.MetricsSecure = true
	})
	// The certificate is self-signed: this test checks who may read, not
	// the server's identity.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(tok string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	eventually(t, 60*time.Second, "the metrics server answers", func() (bool, string) {
		code, _, err := get("")
		return err == nil && code != 0, fmt.Sprint(code, err)
	})
	for _, c := range []struct {
		who, tok string
		code     int
		body     string
	}{
		{"no token", "", http.StatusUnauthorized, "Unauthorized"},
		// controller-runtime's filter answers a token the TokenReview
		// rejects with an error as 500 "Authentication failed".
		{"a wrong token", "not-a-token", http.StatusInternalServerError, "Authentication failed"},
		{"a ServiceAccount without the role", stranger, http.StatusForbidden, `Authorization denied for user system:serviceaccount:default:metrics-stranger`},
		{"a ServiceAccount bound to bootc-fleet-metrics-reader", scraper, http.StatusOK, "controller_runtime_reconcile_total"},
	} {
		code, body, err := get(c.tok)
		if err != nil || code != c.code || !strings.Contains(body, c.body) {
			t.Errorf("%s: %d %q %v, want %d with %q", c.who, code, text.Truncate(body, 200), err, c.code, c.body)
		}
	}
	// Answers are cached as controller-runtime's filter caches them: more
	// scrapes with the same tokens within a minute ask the API server nothing.
	reviews := func() (tokens, access float64) {
		t.Helper()
		raw, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `verb="POST"`) {
				continue
			}
			var n float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &n); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			switch {
			case strings.Contains(line, `resource="tokenreviews"`):
				tokens += n
			case strings.Contains(line, `resource="subjectaccessreviews"`):
				access += n
			}
		}
		return tokens, access
	}
	tokens0, access0 := reviews()
	if tokens0 < 3 || access0 < 2 {
		t.Fatalf("the API server counted %v TokenReviews and %v SubjectAccessReviews for the scrapes above, want at least 3 and 2", tokens0, access0)
	}
	for range 3 {
		for _, tok := range []string{scraper, stranger} {
			if _, _, err := get(tok); err != nil {
				t.Fatal(err)
			}
		}
	}
	if tokens1, access1 := reviews(); tokens1 != tokens0 || access1 != access0 {
		t.Errorf("6 scrapes with known tokens made %v TokenReviews and %v SubjectAccessReviews, want none", tokens1-tokens0, access1-access0)
	}
	// Plain HTTP is not served.
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("metrics served over plain HTTP")
		}
	}
}
