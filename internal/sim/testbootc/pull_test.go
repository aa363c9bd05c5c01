package testbootc_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testregistry"
)

// These tests run the test bootc executable in pull mode against a real
// registry (tests/testregistry: go-containerregistry's registry behind TLS
// and basic auth) and check what bootc would print and stage.

type host struct {
	t    *testing.T
	dir  testbootc.Dir
	root string
	reg  *testregistry.Registry
}

const bootedRef = "quay.io/example/os@sha256:1111111111111111111111111111111111111111111111111111111111111111"

func newHost(t *testing.T, reg *testregistry.Registry, gen testbootc.Generation) *host {
	t.Helper()
	d, err := testbootc.Init(t.TempDir(), testbootc.State{
		Booted: &testbootc.Deployment{Image: bootedRef, Digest: bootedRef[strings.IndexByte(bootedRef, '@')+1:]},
		Knobs:  testbootc.Knobs{Pull: true, Generation: gen},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &host{t: t, dir: d, root: d.Path("root"), reg: reg}
}

type result struct {
	code           int
	stdout, stderr string
}

func (h *host) bootc(args ...string) result {
	h.t.Helper()
	path, env := testbootc.SelfExec(h.dir) // the test binary doubles as test-bootc
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		h.t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

func (h *host) staged() *testbootc.Deployment {
	h.t.Helper()
	m, err := h.dir.Machine()
	if err != nil {
		h.t.Fatal(err)
	}
	return m.State().Staged
}

// private: a registry user with access, its auth.json in /etc, the CA in
// certs.d, and the usual accept-anything policy.
func (h *host) private() {
	h.reg.AddUser("node", "node-secret", true)
	h.reg.WriteAuth(h.t, h.root, "etc/ostree/auth.json", "node", "node-secret")
	h.reg.WriteCA(h.t, h.root)
	testregistry.WritePolicy(h.t, h.root, testregistry.InsecurePolicy)
}

func digest(ref string) string { return ref[strings.IndexByte(ref, '@')+1:] }

func wantFail(t *testing.T, r result, want string) {
	t.Helper()
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Fatalf("exit %d, stderr %q; want exit 1 and %q", r.code, r.stderr, want)
	}
	if !strings.HasPrefix(r.stderr, "error: ") {
		t.Fatalf("stderr %q does not start with bootc's \"error: \"", r.stderr)
	}
}

func TestPullPrivateImage(t *testing.T) {
	reg := testregistry.Start(t)
	img := reg.PushRandom(t, "fleet/os")
	h := newHost(t, reg, testbootc.GenSwitchDownloadOnly)
	h.private()
	r := h.bootc("switch", "--download-only", img)
	if r.code != 0 {
		t.Fatalf("switch: exit %d: %s", r.code, r.stderr)
	}
	st := h.staged()
	if st == nil || st.Image != img || st.Digest != digest(img) || !st.DownloadOnly || st.Signature != "" {
		t.Fatalf("staged %+v, want %s locked, unverified", st, img)
	}
	// bootc prints no signature for an unverified fetch.
	r = h.bootc("status", "--format=json")
	if strings.Contains(r.stdout, `"signature"`) {
		t.Fatalf("status prints a signature for an unverified fetch: %s", r.stdout)
	}
}

func TestPullAuthFileOrder(t *testing.T) {
	reg := testregistry.Start(t)
	img := reg.PushRandom(t, "fleet/os")
	reg.AddUser("node", "node-secret", true)
	unauthorized := "error: Switching: Switching (ostree): Preparing import: Fetching manifest: failed to invoke method OpenImage: reading manifest " +
		digest(img) + " in " + reg.Repo("fleet/os") + ": authentication required\n"
	for _, tc := range []struct {
		name  string
		files map[string]string // path -> password
		ok    bool
	}{
		{"etc", map[string]string{"etc/ostree/auth.json": "node-secret"}, true},
		{"run", map[string]string{"run/ostree/auth.json": "node-secret"}, true},
		{"usr/lib", map[string]string{"usr/lib/ostree/auth.json": "node-secret"}, true},
		// /run comes first (globals.rs open_file), whatever the man page says.
		{"run before etc", map[string]string{"run/ostree/auth.json": "node-secret", "etc/ostree/auth.json": "wrong"}, true},
		{"run wrong, etc right", map[string]string{"run/ostree/auth.json": "wrong", "etc/ostree/auth.json": "node-secret"}, false},
		{"etc before usr/lib", map[string]string{"etc/ostree/auth.json": "wrong", "usr/lib/ostree/auth.json": "node-secret"}, false},
		{"wrong password", map[string]string{"etc/ostree/auth.json": "wrong"}, false},
		{"no auth file", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, reg, testbootc.Gen1_16)
			reg.WriteCA(t, h.root)
			testregistry.WritePolicy(t, h.root, testregistry.InsecurePolicy)
			for p, pass := range tc.files {
				reg.WriteAuth(t, h.root, p, "node", pass)
			}
			r := h.bootc("switch", img)
			if tc.ok {
				if r.code != 0 {
					t.Fatalf("exit %d: %s", r.code, r.stderr)
				}
				return
			}
			if r.code != 1 || r.stderr != unauthorized {
				t.Fatalf("exit %d, stderr %q\nwant exit 1, %q", r.code, r.stderr, unauthorized)
			}
			if h.staged() != nil {
				t.Fatal("a refused pull staged something")
			}
		})
	}
}

func TestPullFailures(t *testing.T) {
	reg := testregistry.Start(t)
	img := reg.PushRandom(t, "fleet/os")
	reg.AddUser("nopull", "nopull-secret", false)
	t.Run("403", func(t *testing.T) {
		h := newHost(t, reg, testbootc.Gen1_16)
		h.private()
		reg.WriteAuth(t, h.root, "etc/ostree/auth.json", "nopull", "nopull-secret")
		wantFail(t, h.bootc("switch", img), "failed to invoke method OpenImage: reading manifest "+digest(img)+" in "+reg.Repo("fleet/os")+": requested access to the resource is denied\n")
	})
	t.Run("no CA", func(t *testing.T) {
		h := newHost(t, reg, testbootc.Gen1_16)
		h.private()
		if err := os.RemoveAll(filepath.Join(h.root, "etc/containers/certs.d")); err != nil {
			t.Fatal(err)
		}
		wantFail(t, h.bootc("switch", img), "failed to invoke method OpenImage: fetching manifest "+digest(img)+" in "+reg.Repo("fleet/os")+": pinging container registry "+reg.Host+": Get \"https://"+reg.Host+"/v2/\": tls: failed to verify certificate: x509: certificate signed by unknown authority")
	})
	t.Run("not there", func(t *testing.T) {
		h := newHost(t, reg, testbootc.Gen1_16)
		h.private()
		missing := reg.Repo("fleet/os") + "@sha256:" + strings.Repeat("e", 64)
		wantFail(t, h.bootc("switch", missing), "reading manifest sha256:"+strings.Repeat("e", 64)+" in "+reg.Repo("fleet/os")+": manifest unknown: Unknown manifest")
	})
	t.Run("no policy", func(t *testing.T) {
		h := newHost(t, reg, testbootc.Gen1_16)
		h.private()
		if err := os.Remove(filepath.Join(h.root, "etc/containers/policy.json")); err != nil {
			t.Fatal(err)
		}
		wantFail(t, h.bootc("switch", img), "error: Switching: Switching (ostree): Creating importer: failed to invoke method Initialize: config file not found")
	})
	t.Run("reject", func(t *testing.T) {
		h := newHost(t, reg, testbootc.Gen1_16)
		h.private()
		testregistry.WritePolicy(t, h.root, `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{"`+reg.Host+`/fleet":[{"type":"reject"}]}}}`)
		wantFail(t, h.bootc("switch", img), "failed to invoke method OpenImage: Running image docker://"+img+" is rejected by policy.\n")
	})
}

func TestPullSignatures(t *testing.T) {
	reg := testregistry.Start(t)
	key := testregistry.NewKey(t)
	signed := reg.PushRandom(t, "fleet/os")
	reg.Sign(t, signed, "", key)
	unsigned := reg.PushRandom(t, "fleet/os")
	wrong := reg.PushRandom(t, "fleet/os")
	reg.Sign(t, wrong, "", testregistry.NewKey(t))
	otherIdentity := reg.PushRandom(t, "fleet/os")
	reg.Sign(t, otherIdentity, reg.Repo("elsewhere/os"), key)
	const enforce = "--enforce-container-sigpolicy"
	prefix := "error: Switching: Switching (ostree): Preparing import: Fetching manifest: failed to invoke method OpenImage: "

	for _, tc := range []struct {
		name   string
		img    string
		args   []string
		want   string // stderr; "" succeeds
		policy string // "" = the sigstore policy
	}{
		{"signed, enforced", signed, []string{enforce}, "", ""},
		{"signed, not enforced", signed, nil, "", ""},
		{"unsigned, enforced", unsigned, []string{enforce}, prefix + "A signature was required, but no signature exists\n", ""},
		// containers/image checks the policy on every pull; bootc's flag
		// only adds its own refusal of an insecure default.
		{"unsigned, not enforced", unsigned, nil, prefix + "A signature was required, but no signature exists\n", ""},
		{"wrong key", wrong, []string{enforce}, prefix + "cryptographic signature verification failed: invalid signature when validating ASN.1 encoded signature\n", ""},
		{"other identity", otherIdentity, []string{enforce}, prefix + "Signature for identity \"" + reg.Repo("elsewhere/os") + "\" is not accepted\n", ""},
		{"insecure default, enforced", signed, []string{enforce},
			"error: Switching: Switching (ostree): Preparing import: Fetching manifest: containers-policy.json specifies a default of `insecureAcceptAnything`; refusing usage\n", testregistry.InsecurePolicy},
		{"insecure default, not enforced", unsigned, nil, "", testregistry.InsecurePolicy},
		// cosign signs the repository name without tag or digest, which the
		// default signedIdentity (matchRepoDigestOrExact) does not accept.
		{"default signedIdentity", signed, []string{enforce}, prefix + "Signature for identity \"" + reg.Repo("fleet/os") + "\" is not accepted\n",
			`{"default":[{"type":"reject"}],"transports":{"docker":{"` + reg.Host + `":[{"type":"sigstoreSigned","keyPath":"/etc/pki/containers/fleet.pub"}]}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, reg, testbootc.Gen1_16)
			h.private()
			reg.WriteSigstorePolicy(t, h.root, key)
			if tc.policy != "" {
				testregistry.WritePolicy(t, h.root, tc.policy)
			}
			r := h.bootc(append(append([]string{"switch"}, tc.args...), tc.img)...)
			if tc.want != "" {
				if r.code != 1 || r.stderr != tc.want {
					t.Fatalf("exit %d, stderr %q\nwant exit 1, %q", r.code, r.stderr, tc.want)
				}
				return
			}
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			st := h.staged()
			wantSig := ""
			if len(tc.args) > 0 {
				wantSig = testbootc.SigContainerPolicy
			}
			if st == nil || st.Image != tc.img || st.Signature != wantSig {
				t.Fatalf("staged %+v, want %s with signature %q", st, tc.img, wantSig)
			}
			r = h.bootc("status", "--format=json")
			var doc struct {
				Spec struct {
					Image struct {
						Signature *string `json:"signature"`
					} `json:"image"`
				} `json:"spec"`
				Status struct {
					Staged struct {
						Image struct {
							Image struct {
								Signature *string `json:"signature"`
							} `json:"image"`
						} `json:"image"`
					} `json:"staged"`
				} `json:"status"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
				t.Fatal(err)
			}
			got := doc.Status.Staged.Image.Image.Signature
			if wantSig == "" && got != nil || wantSig != "" && (got == nil || *got != wantSig) || doc.Spec.Image.Signature == nil != (wantSig == "") {
				t.Fatalf("status signature %v (spec %v), want %q: %s", got, doc.Spec.Image.Signature, wantSig, r.stdout)
			}
		})
	}
}

// switch compares the whole spec, signature included; an image already in
// the repository is not fetched again (digest references), so the enforced
// switch relabels it without asking the registry (ostree-ext
// container/store.rs, prepare_internal).
func TestPullSpecIncludesSignature(t *testing.T) {
	reg := testregistry.Start(t)
	key := testregistry.NewKey(t)
	img := reg.PushRandom(t, "fleet/os")
	reg.Sign(t, img, "", key)
	h := newHost(t, reg, testbootc.Gen1_16)
	h.private()
	reg.WriteSigstorePolicy(t, h.root, key)
	if r := h.bootc("switch", img); r.code != 0 {
		t.Fatalf("switch: %d %s", r.code, r.stderr)
	}
	if r := h.bootc("switch", img); r.code != 0 || strings.TrimSpace(r.stdout) != testbootc.MsgSpecUnchanged {
		t.Fatalf("same switch again: %d %q, want %q", r.code, r.stdout, testbootc.MsgSpecUnchanged)
	}
	before := reg.Requests()
	if r := h.bootc("switch", "--enforce-container-sigpolicy", img); r.code != 0 || strings.Contains(r.stdout, testbootc.MsgSpecUnchanged) {
		t.Fatalf("enforced switch: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if st := h.staged(); st == nil || st.Signature != testbootc.SigContainerPolicy {
		t.Fatalf("staged %+v, want the enforced origin", st)
	}
	if n := reg.Requests() - before; n != 0 {
		t.Fatalf("the enforced switch of an image already pulled made %d registry requests, want 0", n)
	}
	// upgrade --download-only pulls the tracked image with the origin's
	// signature source and locks it.
	r := h.bootc("upgrade", "--download-only")
	if st := h.staged(); r.code != 0 || st == nil || !st.DownloadOnly || st.Signature != testbootc.SigContainerPolicy {
		t.Fatalf("upgrade --download-only: %d %q; staged %+v", r.code, r.stderr, st)
	}
}

func TestPullIndexPeeled(t *testing.T) {
	reg := testregistry.Start(t)
	key := testregistry.NewKey(t)
	index, platform := reg.PushIndex(t, "fleet/os")
	reg.Sign(t, platform, "", key) // only the platform image is signed
	h := newHost(t, reg, testbootc.GenSwitchDownloadOnly)
	h.private()
	reg.WriteSigstorePolicy(t, h.root, key)
	r := h.bootc("switch", "--download-only", "--enforce-container-sigpolicy", index)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if st := h.staged(); st == nil || st.Image != index || st.Digest != digest(platform) {
		t.Fatalf("staged %+v, want %s with digest %s", st, index, digest(platform))
	}
}
