package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// These tests run the real agent with the kubeconfig shapes of real nodes:
// the kubelet's (client certificate and key as FILE paths, behind the
// kubelet-client-current.pem symlink the kubelet swaps when it rotates) and
// EKS's (an exec credential plugin).

// writeKubeconfig writes a kubeconfig for the test API server whose user is
// the given YAML (indented under "user:"), like a kubelet's kubeconfig: the
// CA as a file next to it.
func writeKubeconfig(t *testing.T, dir, user string) string {
	t.Helper()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, env.Config.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: default-cluster
  cluster:
    server: %s
    certificate-authority: %s
contexts:
- name: default-context
  context:
    cluster: default-cluster
    user: default-auth
current-context: default-context
users:
- name: default-auth
  user:
%s
`, env.Config.Host, ca, user)
	p := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// agentLog returns what the agent printed so far.
func (n *node) agentLog() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.out.String()
}

// setDesired changes node's BootcNode spec to desired and returns the new
// metadata.generation: the agent reports at least on every change it sees,
// with status.observedGeneration set to it.
func (n *node) setDesired(desired string) int64 {
	n.t.Helper()
	ctx := context.Background()
	if err := n.k.EnsureBootcNode(ctx, n.name, desired, ""); err != nil {
		n.t.Fatal(err)
	}
	bn := &fleetv1.BootcNode{}
	if err := n.k.C.Get(ctx, client.ObjectKey{Name: n.name}, bn); err != nil {
		n.t.Fatal(err)
	}
	return bn.Generation
}

// waitFor is wait with a caller-chosen bound.
func (n *node) waitFor(what string, d time.Duration, ok func(fleetv1.BootcNodeStatus) bool) fleetv1.BootcNodeStatus {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	st, err := n.k.WaitStatus(ctx, n.name, ok)
	if err != nil {
		n.t.Fatalf("%s: %v", what, err)
	}
	return st
}

// certClient is an HTTP client of the API server presenting one fixed
// client certificate; each call reports whether it reused a connection.
type certClient struct {
	c    *http.Client
	host string
}

func newCertClient(t *testing.T, certPEM, keyPEM []byte) *certClient {
	t.Helper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(env.Config.CAData) {
		t.Fatal("no API server CA")
	}
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
		ForceAttemptHTTP2: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &certClient{c: &http.Client{Transport: tr, Timeout: 30 * time.Second}, host: strings.TrimSuffix(env.Config.Host, "/")}
}

// get GETs path and returns the status code and whether the request went
// over an already open connection (whose TLS handshake, and so whose client
// certificate, predates this request).
func (c *certClient) get(t *testing.T, path string) (code int, reused bool) {
	t.Helper()
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.host+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp.StatusCode, reused
}

// TestAgentSurvivesClientCertRotation rotates the kubelet's client
// certificate under a running agent the way the kubelet does: a new dated
// PEM file (certificate and key), then kubelet-client-current.pem, the
// symlink both client-certificate and client-key name, is atomically
// replaced. The first certificate then expires; from then on the API server
// refuses it on every request, also on connections opened before (checked
// here), so a status write after the expiry proves the agent presents the
// new one, in the same process.
func TestAgentSurvivesClientCertRotation(t *testing.T) {
	const firstLifetime = 60 * time.Second
	n := newNode(t, "it-rot")
	user, groups := "system:node:"+n.name, []string{"system:nodes"}
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		t.Fatal(err)
	}
	current := filepath.Join(pki, "kubelet-client-current.pem")
	// issue writes a dated cert+key file; point makes current a symlink to it
	// by renaming a fresh symlink over it (what the kubelet's certificate
	// store does).
	issue := func(notAfter time.Time) (file string, certPEM, keyPEM []byte) {
		certPEM, keyPEM, err := env.SignClientCert(user, groups, notAfter)
		if err != nil {
			t.Fatal(err)
		}
		file = filepath.Join(pki, "kubelet-client-"+time.Now().Format("2006-01-02-15-04-05.000000000")+".pem")
		if err := os.WriteFile(file, append(append([]byte{}, certPEM...), keyPEM...), 0o600); err != nil {
			t.Fatal(err)
		}
		return file, certPEM, keyPEM
	}
	point := func(file string) {
		tmp := current + ".tmp"
		_ = os.Remove(tmp)
		if err := os.Symlink(filepath.Base(file), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, current); err != nil {
			t.Fatal(err)
		}
	}

	t0 := time.Now()
	expiry := t0.Add(firstLifetime).Truncate(time.Second) // x509 times have whole seconds
	first, cert1, key1 := issue(expiry)
	point(first)
	n.kc = writeKubeconfig(t, dir, fmt.Sprintf("    client-certificate: %s\n    client-key: %s", current, current))

	// The first certificate works, also on a connection kept open: that
	// connection is used again after the expiry.
	old := newCertClient(t, cert1, key1)
	if code, _ := old.get(t, "/apis/fleet.bootc.dev/v1alpha1/bootcnodes/"+n.name); code != http.StatusOK {
		t.Fatalf("first certificate: GET own BootcNode = %d, want 200", code)
	}

	n.start()
	st := n.wait("first report with the first certificate", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	firstReport := time.Now()
	if st.LastReportTime == nil || st.LastReportTime.Time.Before(t0) {
		t.Fatalf("first report's lastReportTime %v is before the test began (%s)", st.LastReportTime, t0)
	}
	if log := n.agentLog(); !strings.Contains(log, "using kubeconfig") || !strings.Contains(log, current+" (reloaded when they change)") {
		t.Fatalf("agent did not log the kubeconfig and its reloading certificate files:\n%s", log)
	}

	// Rotate, as the kubelet does, well before the expiry.
	second, _, _ := issue(time.Now().Add(time.Hour))
	point(second)
	swapped := time.Now()
	if !swapped.Before(expiry) {
		t.Fatalf("setup too slow: the symlink was swapped %s after the first certificate expired (first report after %s)",
			swapped.Sub(expiry), firstReport.Sub(t0))
	}
	t.Logf("first certificate valid until t0+%s; agent's first report at t0+%s; symlink swapped at t0+%s",
		expiry.Sub(t0), firstReport.Sub(t0).Round(time.Millisecond), swapped.Sub(t0).Round(time.Millisecond))

	// Keep the old connection busy until the first certificate expires, then
	// use it once more.
	path := "/apis/fleet.bootc.dev/v1alpha1/bootcnodes/" + n.name
	var lastOK time.Time
	for time.Until(expiry) > 5*time.Second {
		code, reused := old.get(t, path)
		if code != http.StatusOK || !reused {
			t.Fatalf("first certificate before its expiry: GET = %d (connection reused %v), want 200 on the open connection", code, reused)
		}
		lastOK = time.Now()
		time.Sleep(min(5*time.Second, time.Until(expiry)-5*time.Second))
	}
	time.Sleep(time.Until(expiry.Add(time.Second)))
	code, reused := old.get(t, path)
	if code != http.StatusUnauthorized || !reused {
		t.Fatalf("first certificate after its expiry: GET = %d (connection reused %v), want 401 on the connection opened before", code, reused)
	}
	t.Logf("first certificate: last accepted at t0+%s; refused (401) on the same connection at t0+%s",
		lastOK.Sub(t0).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	fresh := newCertClient(t, cert1, key1)
	if code, _ := fresh.get(t, path); code != http.StatusUnauthorized {
		t.Fatalf("first certificate after its expiry on a new connection: GET = %d, want 401", code)
	}

	// Provoke a report: only a write with the second certificate can land.
	gen := n.setDesired(imgV3)
	changed := time.Now()
	st = n.waitFor("a status write after the first certificate expired", 4*time.Minute, func(s fleetv1.BootcNodeStatus) bool {
		return s.ObservedGeneration == gen && s.Phase == fleetv1.PhaseWaiting
	})
	reported := time.Now()
	select {
	case <-n.exited:
		t.Fatal("the agent exited")
	default:
	}
	if !st.LastReportTime.After(expiry) {
		t.Fatalf("lastReportTime %s is not after the first certificate's expiry %s", st.LastReportTime, expiry)
	}
	log := n.agentLog()
	t.Logf("spec changed at t0+%s (generation %d), reported at t0+%s (%s later, lastReportTime %s); the agent logged %d lines with \"Unauthorized\"",
		changed.Sub(t0).Round(time.Millisecond), gen, reported.Sub(t0).Round(time.Millisecond),
		reported.Sub(changed).Round(time.Millisecond), st.LastReportTime.Format(time.RFC3339Nano), strings.Count(log, "Unauthorized"))
}

// TestAgentReportsThroughExecPlugin gives the agent a kubeconfig whose user
// is an exec credential plugin (as on EKS, where it is `aws eks get-token`)
// printing a client.authentication.k8s.io/v1 ExecCredential with the node's
// client certificate; the agent reports through it and keeps writing.
func TestAgentReportsThroughExecPlugin(t *testing.T) {
	n := newNode(t, "it-exec")
	dir := t.TempDir()
	certPEM, keyPEM, err := env.SignClientCert("system:node:"+n.name, []string{"system:nodes"}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cred, err := json.Marshal(map[string]any{
		"apiVersion": "client.authentication.k8s.io/v1",
		"kind":       "ExecCredential",
		"status":     map[string]string{"clientCertificateData": string(certPEM), "clientKeyData": string(keyPEM)},
	})
	if err != nil {
		t.Fatal(err)
	}
	credFile, calls := filepath.Join(dir, "cred.json"), filepath.Join(dir, "calls")
	if err := os.WriteFile(credFile, cred, 0o600); err != nil {
		t.Fatal(err)
	}
	// The plugin records each call's KUBERNETES_EXEC_INFO (client-go's
	// request) and prints the credential.
	plugin := filepath.Join(dir, "node-credential")
	script := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\n' \"$KUBERNETES_EXEC_INFO\" >> %s\nexec cat %s\n", calls, credFile)
	if err := os.WriteFile(plugin, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	n.kc = writeKubeconfig(t, dir, fmt.Sprintf(`    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: %s
      args: ["--node", %q]
      interactiveMode: Never`, plugin, n.name))

	start := time.Now()
	n.start()
	n.wait("first report through the exec plugin", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	first := time.Since(start)
	gen := n.setDesired(imgV3)
	st := n.wait("a report of the spec change", func(s fleetv1.BootcNodeStatus) bool {
		return s.ObservedGeneration == gen && s.Phase == fleetv1.PhaseWaiting
	})
	if log := n.agentLog(); !strings.Contains(log, "exec credential plugin "+plugin) {
		t.Fatalf("agent did not log its exec plugin:\n%s", log)
	}
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatalf("the plugin was never run: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var info struct {
		APIVersion string `json:"apiVersion"`
		Spec       struct {
			Interactive bool `json:"interactive"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &info); err != nil || info.APIVersion != "client.authentication.k8s.io/v1" || info.Spec.Interactive {
		t.Fatalf("plugin called with KUBERNETES_EXEC_INFO %q (%v)", lines[0], err)
	}
	t.Logf("first report %s after start; spec change reported (observedGeneration %d, lastReportTime %s); plugin ran %d time(s)",
		first.Round(time.Millisecond), st.ObservedGeneration, st.LastReportTime.Format(time.RFC3339Nano), len(lines))
}
