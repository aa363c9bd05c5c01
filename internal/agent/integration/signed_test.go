package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
	"github.com/bootc-fleet/bootc-fleet/tests/testregistry"
)

// These tests run the real agent and the test bootc executable in pull
// mode against a real registry (tests/testregistry: TLS with a CA made for
// the test, basic auth answering 401 as registries do): the host's
// auth.json, certs.d and signature policy decide, as on a bootc host
// (docs/design.md, amendment 14).

// pullNode is a node whose test bootc pulls from reg, desiring image.
func pullNode(t *testing.T, name string, reg *testregistry.Registry, image string) (*node, string) {
	t.Helper()
	n := newNode(t, name)
	if err := n.dir.Configure(func(k *testbootc.Knobs) { k.Pull = true }); err != nil {
		t.Fatal(err)
	}
	root := n.dir.Path("root")
	reg.WriteCA(t, root)
	testregistry.WritePolicy(t, root, testregistry.InsecurePolicy)
	if err := n.k.EnsureBootcNode(context.Background(), name, image, ""); err != nil {
		t.Fatal(err)
	}
	return n, root
}

// stageSwitches returns the switch command lines the agent ran.
func (n *node) stageSwitches() [][]string {
	n.t.Helper()
	inv, err := n.dir.Invocations()
	if err != nil {
		n.t.Fatal(err)
	}
	var out [][]string
	for _, i := range inv {
		if len(i.Args) > 0 && i.Args[0] == "switch" && i.Args[len(i.Args)-1] != "--help" {
			out = append(out, i.Args)
		}
	}
	return out
}

// A private image: a wrong password in /etc/ostree/auth.json is a
// StageFailed naming the auth files; the right one in /run/ostree/auth.json,
// which bootc reads first, stages it on the next attempt.
func TestAgentPullsPrivateImage(t *testing.T) {
	reg := testregistry.Start(t)
	img := reg.PushRandom(t, "fleet/os")
	reg.AddUser("node", "node-secret", true)
	n, root := pullNode(t, "it-private", reg, img)
	reg.WriteAuth(t, root, "etc/ostree/auth.json", "node", "wrong")
	n.start()
	n.grant(lease.KindStage, img, "")
	st := n.wait("StageFailed", testcoord.PhaseIs(fleetv1.PhaseDegraded, fleetv1.ReasonStageFailed))
	for _, want := range []string{"RegistryUnauthorized: ", "/run/ostree/auth.json, then /etc/ostree/auth.json, then /usr/lib/ostree/auth.json",
		"reading manifest " + digestOf(img) + " in " + reg.Repo("fleet/os") + ": authentication required"} {
		if !strings.Contains(st.Message, want) {
			t.Fatalf("message %q lacks %q", st.Message, want)
		}
	}
	t.Logf("BootcNode: %s/%s: %s", st.Phase, st.Reason, st.Message)
	if !strings.HasPrefix(st.Message, "RegistryUnauthorized: ") {
		t.Fatalf("message %q does not start with RegistryUnauthorized:", st.Message)
	}
	// Still under the grant while retrying.
	n.wait("grant still listed", testcoord.Lists(mustGrant(t, n), ""))

	reg.WriteAuth(t, root, "run/ostree/auth.json", "node", "node-secret")
	st = n.waitFor("Staged after the retry", 2*time.Minute, testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if st.Staged == nil || st.Staged.Digest != digestOf(img) || st.Staged.Signature != fleetv1.SignatureInsecure {
		t.Fatalf("staged %+v, want %s unverified (Insecure)", st.Staged, img)
	}
	for _, sw := range n.stageSwitches() {
		if strings.Contains(strings.Join(sw, " "), "--enforce-container-sigpolicy") {
			t.Fatalf("switch %q enforces signatures without requireSignedImages", sw)
		}
	}
}

func mustGrant(t *testing.T, n *node) lease.ID {
	t.Helper()
	l, err := n.k.Lease(context.Background(), lease.KindStage, 0)
	if err != nil {
		t.Fatal(err)
	}
	return lease.ID{Lease: l.Name, UID: l.UID, Transitions: *l.Spec.LeaseTransitions}
}

// Under requireSignedImages the agent stages with
// --enforce-container-sigpolicy: a correctly signed image is staged and
// reported ContainerPolicy; an unsigned or wrongly signed one, or a policy
// whose default accepts anything, is Degraded/SignatureRejected with
// bootc's message, the stage grant let go, and never tried again.
func TestAgentSignedImages(t *testing.T) {
	reg := testregistry.Start(t)
	key := testregistry.NewKey(t)
	signed := reg.PushRandom(t, "fleet/os")
	reg.Sign(t, signed, "", key)
	unsigned := reg.PushRandom(t, "fleet/os")
	wrong := reg.PushRandom(t, "fleet/os")
	reg.Sign(t, wrong, "", testregistry.NewKey(t))
	reg.AddUser("node", "node-secret", true)

	for i, tc := range []struct {
		name   string
		img    string
		policy string // "" = the sigstore policy
		want   string // bootc's message on rejection; "" stages
	}{
		{"signed", signed, "", ""},
		{"unsigned", unsigned, "", "A signature was required, but no signature exists"},
		{"wrongly signed", wrong, "", "cryptographic signature verification failed: invalid signature when validating ASN.1 encoded signature"},
		{"insecure default", signed, testregistry.InsecurePolicy, "containers-policy.json specifies a default of `insecureAcceptAnything`; refusing usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, root := pullNode(t, "it-signed-"+string(rune('a'+i)), reg, tc.img)
			reg.WriteAuth(t, root, "etc/ostree/auth.json", "node", "node-secret")
			reg.WriteSigstorePolicy(t, root, key)
			if tc.policy != "" {
				testregistry.WritePolicy(t, root, tc.policy)
			}
			ctx := context.Background()
			if err := n.k.SetRequireSignedImages(ctx, n.name, true); err != nil {
				t.Fatal(err)
			}
			n.start()
			n.grant(lease.KindStage, tc.img, "")
			if tc.want == "" {
				st := n.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
				if st.Staged == nil || st.Staged.Digest != digestOf(tc.img) || !st.Staged.Verified() {
					t.Fatalf("staged %+v, want %s verified (ContainerPolicy)", st.Staged, tc.img)
				}
				sw := n.stageSwitches()
				if len(sw) != 1 || sw[0][1] != "--enforce-container-sigpolicy" {
					t.Fatalf("switches %q, want one with --enforce-container-sigpolicy", sw)
				}
				return
			}
			id := mustGrant(t, n)
			st := n.wait("SignatureRejected", testcoord.PhaseIs(fleetv1.PhaseDegraded, fleetv1.ReasonSignatureRejected))
			if !strings.Contains(st.Message, tc.want) {
				t.Fatalf("message %q lacks bootc's %q", st.Message, tc.want)
			}
			t.Logf("BootcNode: %s/%s: %s", st.Phase, st.Reason, st.Message)
			n.wait("grant released", testcoord.Lists(id, fleetv1.ReasonSignatureRejected))
			if st.Staged != nil {
				t.Fatalf("something is staged after the rejection: %+v", st.Staged)
			}
			// The grant stays held by this stand-in coordinator; the agent
			// must not try the image again.
			before := len(n.stageSwitches())
			time.Sleep(5 * time.Second)
			if after := len(n.stageSwitches()); after != before || before != 1 {
				t.Fatalf("%d switches after the rejection (was %d), want exactly 1 in all", after, before)
			}
			n.wait("still SignatureRejected", testcoord.PhaseIs(fleetv1.PhaseDegraded, fleetv1.ReasonSignatureRejected))
		})
	}
}
