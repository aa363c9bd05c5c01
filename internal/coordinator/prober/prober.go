// Package prober runs a pool's metrics health query (docs/design.md,
// amendment 24) against its Prometheus server through the client
// library's API package: one instant query, a timeout, the pool's CA and
// bearer token, a bounded answer, and only a vector accepted.
package prober

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// Bounds of one query.
const (
	// DefaultTimeout bounds one query, connection included.
	DefaultTimeout = 10 * time.Second
	// MaxResponseBytes bounds the body read from the server.
	MaxResponseBytes = 4 << 20
	// MaxSeries bounds the series of a result.
	MaxSeries = 10000
)

// Target is where and how a query is sent.
type Target struct {
	URL   string
	Query string
	// CA is a PEM bundle that verifies an https URL (nil: the system's).
	CA []byte
	// Token is sent as the bearer token ("" for none).
	Token string
	// Timeout bounds the query (0: DefaultTimeout).
	Timeout time.Duration
}

// ErrNotVector is the error when the query returned a scalar, a string or a range.
var ErrNotVector = errors.New("the query did not return an instant vector")

// ErrTooLarge is the error when the answer exceeded MaxResponseBytes or MaxSeries.
var ErrTooLarge = errors.New("the query's answer is too large")

// Query runs t's instant query now and returns its vector.
func Query(ctx context.Context, t Target) (model.Vector, error) {
	rt, err := transport(t)
	if err != nil {
		return nil, err
	}
	c, err := api.NewClient(api.Config{Address: t.URL, RoundTripper: rt})
	if err != nil {
		return nil, fmt.Errorf("prometheus URL %s: %w", t.URL, err)
	}
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, _, _, err := promv1.NewAPI(c).Query(ctx, t.Query, time.Time{}, promv1.WithTimeout(timeout))
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, MaxResponseBytes)
		}
		return nil, fmt.Errorf("querying %s: %w", t.URL, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		typ := "nothing"
		if v != nil {
			typ = v.Type().String()
		}
		return nil, fmt.Errorf("%w: it returned a %s", ErrNotVector, typ)
	}
	if len(vec) > MaxSeries {
		return nil, fmt.Errorf("%w: %d series, at most %d", ErrTooLarge, len(vec), MaxSeries)
	}
	return vec, nil
}

// transport trusts t's CA, sends its token and bounds what it reads.
func transport(t Target) (http.RoundTripper, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	if len(t.CA) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(t.CA) {
			return nil, errors.New("the CA bundle holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &bounded{next: tr, token: t.Token}, nil
}

// bounded adds the bearer token and cuts the body at MaxResponseBytes.
type bounded struct {
	next  http.RoundTripper
	token string
}

func (b *bounded) RoundTrip(req *http.Request) (*http.Response, error) {
	if b.token != "" {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(b.token))
	}
	resp, err := b.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &limited{r: resp.Body, left: MaxResponseBytes}
	return resp, nil
}

// limited fails a read past its limit, so a cut answer is an error, never a
// shorter (valid-looking) one.
type limited struct {
	r    io.ReadCloser
	left int64
}

func (l *limited) Read(p []byte) (int, error) {
	if l.left <= 0 {
		var one [1]byte
		if n, _ := l.r.Read(one[:]); n > 0 {
			return 0, ErrTooLarge
		}
		return l.r.Read(p)
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limited) Close() error { return l.r.Close() }
