package prober

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/health"
	"github.com/bootc-fleet/bootc-fleet/tests/promtest"
)

// A real Prometheus (Debian's prometheus package) scrapes an exporter this
// test serves and evaluates an alerting rule on it; the prober queries the
// alerts as a pool's metrics check does.

const rules = `groups:
  - name: test
    rules:
      - alert: NodeBroken
        expr: bootc_fleet_test_broken > 0
        labels:
          severity: critical
`

func TestPrometheus(t *testing.T) {
	reg := prometheus.NewRegistry()
	broken := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "bootc_fleet_test_broken", Help: "1 when the node is broken"}, []string{"node"})
	reg.MustRegister(broken)
	broken.WithLabelValues("n1").Set(0)
	broken.WithLabelValues("n2").Set(0)
	exporter := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer exporter.Close()
	promURL := promtest.Start(t, rules, strings.TrimPrefix(exporter.URL, "http://"))
	ctx := context.Background()
	alerts := `ALERTS{alertstate="firing",severity="critical"}`

	t.Run("the alert fires for the broken node only", func(t *testing.T) {
		promtest.WaitFor(t, 60*time.Second, "the exporter scraped", func() bool {
			v, err := Query(ctx, Target{URL: promURL, Query: `bootc_fleet_test_broken`})
			return err == nil && len(v) == 2
		})
		v, err := Query(ctx, Target{URL: promURL, Query: alerts})
		if err != nil || len(v) != 0 {
			t.Fatalf("before: %v, %v", v, err)
		}
		broken.WithLabelValues("n1").Set(1)
		var fired map[string]string
		promtest.WaitFor(t, 60*time.Second, "the alert firing for n1", func() bool {
			v, err := Query(ctx, Target{URL: promURL, Query: alerts})
			if err != nil {
				t.Fatal(err)
			}
			fired = health.Firing("node", v)
			return len(fired) > 0
		})
		if _, ok := fired["n2"]; ok || !strings.Contains(fired["n1"], `alertname="NodeBroken"`) {
			t.Fatalf("fired %v", fired)
		}
		if r := health.Metrics("node", "n2", nil, nil); !r.Pass {
			t.Fatalf("n2: %+v", r)
		}
		v, err = Query(ctx, Target{URL: promURL, Query: alerts})
		if r := health.Metrics("", "n1", v, err); r.Pass || r.Reason != "MetricsFiring" {
			t.Fatalf("n1: %+v", r)
		}
	})

	t.Run("bad PromQL is an error naming it", func(t *testing.T) {
		_, err := Query(ctx, Target{URL: promURL, Query: `sum(`})
		if err == nil || !strings.Contains(err.Error(), "parse error") {
			t.Fatalf("error %v", err)
		}
	})

	t.Run("a scalar is refused, naming its type", func(t *testing.T) {
		_, err := Query(ctx, Target{URL: promURL, Query: `1`})
		if !errors.Is(err, ErrNotVector) || !strings.Contains(err.Error(), "scalar") {
			t.Fatalf("error %v", err)
		}
	})

	t.Run("https with the CA, and the bearer token reaching the server", func(t *testing.T) {
		httpsWithToken(t, promURL)
	})
}

// httpsWithToken puts a TLS reverse proxy that requires a bearer token
// before Prometheus (2.42 can serve TLS but not require a token).
func httpsWithToken(t *testing.T, promURL string) {
	up, err := url.Parse(promURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(up)
	proxy := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: proxy.Certificate().Raw})
	ctx := context.Background()
	q := `bootc_fleet_test_broken`
	if v, err := Query(ctx, Target{URL: proxy.URL, Query: q, CA: ca, Token: "s3cret\n"}); err != nil || len(v) != 2 {
		t.Fatalf("with CA and token: %v, %v", v, err)
	}
	if _, err := Query(ctx, Target{URL: proxy.URL, Query: q, CA: ca}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("without the token: %v", err)
	}
	if _, err := Query(ctx, Target{URL: proxy.URL, Query: q, Token: "s3cret"}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v", err)
	}
	if _, err := Query(ctx, Target{URL: proxy.URL, Query: q, CA: []byte("not pem")}); err == nil || !strings.Contains(err.Error(), "PEM") {
		t.Fatalf("a CA that is none: %v", err)
	}
}

func TestUnreachable(t *testing.T) {
	addr := promtest.FreeAddr(t) // closed again: nothing listens there
	_, err := Query(context.Background(), Target{URL: "http://" + addr, Query: "up", Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("error %v", err)
	}
	if r := health.Metrics("node", "n1", nil, err); r.Pass || r.Reason != "MetricsQueryFailed" || !strings.Contains(r.Message, addr) {
		t.Fatalf("result %+v", r)
	}
	// A server that never answers ends at the timeout.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	_, err = Query(context.Background(), Target{URL: "http://" + l.Addr().String(), Query: "up", Timeout: 500 * time.Millisecond})
	if err == nil || time.Since(start) > 30*time.Second {
		t.Fatalf("silent server: %v after %s", err, time.Since(start))
	}
}

func TestOversizedAnswerIsRefused(t *testing.T) {
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[`)
		for i := 0; i < MaxResponseBytes/40+1; i++ {
			if i > 0 {
				fmt.Fprint(w, ",")
			}
			fmt.Fprintf(w, `{"metric":{"n":"%024d"},"value":[1,"1"]}`, i)
		}
		fmt.Fprint(w, `]}}`)
	}))
	defer big.Close()
	_, err := Query(context.Background(), Target{URL: big.URL, Query: "up"})
	if err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("error %v", err)
	}
}
