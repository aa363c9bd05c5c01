package testbootc

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
)

const (
	dA   = "sha256:736b359467c9437c1ac915acaae952aad854e07eb4a16a94999a48af08c83c34"
	dB   = "sha256:16dc2b6256b4ff0d2ec18d2dbfb06d117904010c8cf9732cdb022818cf7a7566"
	dC   = "sha256:b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c"
	refA = "quay.io/example/os@" + dA
	refB = "quay.io/example/os@" + dB
	refC = "quay.io/example/os@" + dC
)

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open("../../agent/bootc/testdata/host-v1.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("host-v1.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("host-v1.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func booted(t *testing.T, ref string) *Machine {
	t.Helper()
	m, err := NewBooted(ref)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type wantDoc struct {
	booted, staged, rollback string // digests, "" = null
	stagedLocked             bool
}

// TestDocumentsMatchSchemaAndParse checks every kind of document the
// Machine prints against bootc's published schema and reads it back.
func TestDocumentsMatchSchemaAndParse(t *testing.T) {
	schema := compileSchema(t)
	tests := []struct {
		name  string
		setup func(t *testing.T) *Machine
		want  wantDoc
	}{
		{"booted only", func(t *testing.T) *Machine { return booted(t, refA) }, wantDoc{booted: dA}},
		{"staged download-only", func(t *testing.T) *Machine {
			m := booted(t, refA)
			must(t, m.Switch(refB))
			return m
		}, wantDoc{booted: dA, staged: dB, stagedLocked: true}},
		{"staged unlocked with version", func(t *testing.T) *Machine {
			m := booted(t, refA)
			m.Configure(func(k *Knobs) { k.Versions = map[string]string{dB: "42.1"}; k.SoftRebootCapable = true })
			must(t, m.Switch(refB))
			must(t, m.Apply())
			return m
		}, wantDoc{booted: dA, staged: dB}},
		{"after reboot with rollback", func(t *testing.T) *Machine {
			m := booted(t, refA)
			must(t, m.Switch(refB))
			must(t, m.Apply())
			m.Reboot(RebootOptions{})
			return m
		}, wantDoc{booted: dB, rollback: dA}},
		{"rollback and new staged", func(t *testing.T) *Machine {
			m := booted(t, refA)
			must(t, m.Switch(refB))
			must(t, m.Apply())
			m.Reboot(RebootOptions{})
			must(t, m.Switch(refC))
			return m
		}, wantDoc{booted: dB, staged: dC, rollback: dA, stagedLocked: true}},
		{"rollback queued", func(t *testing.T) *Machine {
			m := upgraded(t, Knobs{SoftRebootCapable: true})
			if _, err := m.Rollback(""); err != nil {
				t.Fatal(err)
			}
			return m
		}, wantDoc{booted: dB, rollback: dA}},
		{"v1alpha1 host", func(t *testing.T) *Machine {
			m := booted(t, refA)
			m.Configure(func(k *Knobs) { k.APIVersion = bootc.APIVersionV1Alpha1 })
			return m
		}, wantDoc{booted: dA}},
		{"nothing booted", func(*testing.T) *Machine { return NewMachine(State{}) }, wantDoc{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := tc.setup(t).Status()
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
			if err != nil {
				t.Fatal(err)
			}
			if err := schema.Validate(inst); err != nil {
				t.Fatalf("document does not match host-v1.schema.json: %v\n%s", err, doc)
			}
			s, err := bootc.Parse(doc)
			if err != nil {
				t.Fatalf("bootc.Parse: %v\n%s", err, doc)
			}
			got := wantDoc{booted: digest(s.Booted), staged: digest(s.Staged), rollback: digest(s.Rollback)}
			if s.Staged != nil {
				got.stagedLocked = s.Staged.DownloadOnly
			}
			if got != tc.want {
				t.Errorf("parsed %+v, want %+v", got, tc.want)
			}
			for _, e := range []*bootc.Entry{s.Booted, s.Staged, s.Rollback} {
				if e == nil {
					continue
				}
				if p, err := e.Pinned(); err != nil || p.Digest != e.Digest {
					t.Errorf("entry %+v: Pinned() = %v, %v", e, p, err)
				}
			}
		})
	}
}

func digest(e *bootc.Entry) string {
	if e == nil {
		return ""
	}
	return e.Digest
}

func parse(t *testing.T, m *Machine) wantDoc {
	t.Helper()
	s, err := bootc.Parse(m.Status())
	if err != nil {
		t.Fatal(err)
	}
	w := wantDoc{booted: digest(s.Booted), staged: digest(s.Staged), rollback: digest(s.Rollback)}
	if s.Staged != nil {
		w.stagedLocked = s.Staged.DownloadOnly
	}
	return w
}

func TestMachineReboots(t *testing.T) {
	tests := []struct {
		name      string
		knobs     Knobs
		steps     func(t *testing.T, m *Machine)
		want      wantDoc
		newBootID bool
		softCount uint32
	}{
		{"reboot applies an unlocked staged image", Knobs{}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.Apply())
			m.Reboot(RebootOptions{})
		}, wantDoc{booted: dB, rollback: dA}, true, 0},
		{"reboot discards a locked staged image", Knobs{}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			m.Reboot(RebootOptions{})
		}, wantDoc{booted: dA}, true, 0},
		{"upgrade --download-only locks the image a switch staged", Knobs{}, func(t *testing.T, m *Machine) {
			if changed, err := m.SwitchTo(refB, false); err != nil || !changed {
				t.Fatalf("SwitchTo = %v, %v", changed, err)
			}
			if line, err := m.UpgradeDownloadOnly(); err != nil || line != MsgDownloadedLocked {
				t.Fatalf("UpgradeDownloadOnly = %q, %v", line, err)
			}
		}, wantDoc{booted: dA, staged: dB, stagedLocked: true}, false, 0},
		{"an unlocked switch is applied by a reboot", Knobs{}, func(t *testing.T, m *Machine) {
			if _, err := m.SwitchTo(refB, false); err != nil {
				t.Fatal(err)
			}
			m.Reboot(RebootOptions{})
		}, wantDoc{booted: dB, rollback: dA}, true, 0},
		{"switch to the tracked staged image changes nothing", Knobs{}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			if changed, err := m.SwitchTo(refB, false); err != nil || changed {
				t.Fatalf("SwitchTo = %v, %v; want unchanged", changed, err)
			}
		}, wantDoc{booted: dA, staged: dB, stagedLocked: true}, false, 0},
		{"a manifest list is peeled to the platform manifest", Knobs{ManifestLists: map[string]string{dB: dC}}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			if st := m.State().Staged; st.Image != refB {
				t.Fatalf("staged image %q, want the reference as given %q", st.Image, refB)
			}
		}, wantDoc{booted: dA, staged: dC, stagedLocked: true}, false, 0},
		{"reboot with nothing staged changes only the boot", Knobs{}, func(_ *testing.T, m *Machine) {
			m.Reboot(RebootOptions{})
		}, wantDoc{booted: dA}, true, 0},
		{"switch replaces a staged image", Knobs{}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.Apply())
			must(t, m.Switch(refC))
		}, wantDoc{booted: dA, staged: dC, stagedLocked: true}, false, 0},
		{"switch to the booted image is a no-op", Knobs{}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refA))
		}, wantDoc{booted: dA}, false, 0},
		{"soft reboot enters a capable image unlocked with --soft-reboot=auto, same boot ID", Knobs{SoftRebootCapable: true}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.ApplySoft(SoftRebootAuto))
			m.SoftReboot(RebootOptions{})
		}, wantDoc{booted: dB, rollback: dA}, false, 1},
		{"soft reboot enters a capable image unlocked with --soft-reboot=required", Knobs{SoftRebootCapable: true}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.ApplySoft(SoftRebootRequired))
			m.SoftReboot(RebootOptions{})
		}, wantDoc{booted: dB, rollback: dA}, false, 1},
		// Without --soft-reboot nothing set up /run/nextroot: systemd
		// restarts userspace on the old root.
		{"soft reboot after a plain unlock stays on the booted image", Knobs{SoftRebootCapable: true}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.Apply())
			m.SoftReboot(RebootOptions{})
		}, wantDoc{booted: dA, staged: dB}, false, 1},
		{"soft reboot does not enter an incapable image (auto prepared nothing)", Knobs{}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.ApplySoft(SoftRebootAuto))
			m.SoftReboot(RebootOptions{})
		}, wantDoc{booted: dA, staged: dB}, false, 1},
		{"a soft reboot prepared for a replaced staged image does not enter the new one", Knobs{SoftRebootCapable: true}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.ApplySoft(SoftRebootAuto))
			must(t, m.Switch(refC))
			must(t, m.Apply())
			m.SoftReboot(RebootOptions{})
		}, wantDoc{booted: dA, staged: dC}, false, 1},
		{"a prepared soft reboot is used up by the soft reboot", Knobs{SoftRebootCapable: true}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.Apply())
			m.SoftReboot(RebootOptions{})
			must(t, m.Switch(refC))
			must(t, m.ApplySoft(SoftRebootAuto))
			m.SoftReboot(RebootOptions{})
			if nr := m.State().NextRoot; nr != "" {
				t.Errorf("NextRoot %q after the soft reboot that used it", nr)
			}
			must(t, m.Switch(refB))
			must(t, m.Apply())
			m.SoftReboot(RebootOptions{})
		}, wantDoc{booted: dC, rollback: dA, staged: dB}, false, 3},
		{"a full reboot drops the prepared soft reboot (it lives in /run)", Knobs{SoftRebootCapable: true}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			must(t, m.ApplySoft(SoftRebootAuto))
			m.Reboot(RebootOptions{})
			must(t, m.Switch(refC))
			must(t, m.Apply())
			if nr := m.State().NextRoot; nr != "" {
				t.Errorf("NextRoot %q after a full reboot", nr)
			}
			m.SoftReboot(RebootOptions{})
		}, wantDoc{booted: dB, rollback: dA, staged: dC}, true, 1},
		{"soft reboot does not enter a locked image", Knobs{SoftRebootCapable: true}, func(t *testing.T, m *Machine) {
			must(t, m.Switch(refB))
			m.SoftReboot(RebootOptions{})
		}, wantDoc{booted: dA, staged: dB, stagedLocked: true}, false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := booted(t, refA)
			m.Configure(func(k *Knobs) { *k = tc.knobs })
			before := m.BootID()
			tc.steps(t, m)
			if got := parse(t, m); got != tc.want {
				t.Errorf("status %+v, want %+v", got, tc.want)
			}
			if changed := m.BootID() != before; changed != tc.newBootID {
				t.Errorf("boot ID changed = %v, want %v", changed, tc.newBootID)
			}
			if got := m.State().SoftRebootCount; got != tc.softCount {
				t.Errorf("SoftRebootCount = %d, want %d", got, tc.softCount)
			}
		})
	}
}

// bootc unlocks first and then checks the soft-reboot mode, so "required"
// on an incapable deployment fails with the deployment already unlocked.
func TestMachineSoftRebootRequired(t *testing.T) {
	m := booted(t, refA)
	must(t, m.Switch(refB))
	if err := m.ApplySoft(SoftRebootRequired); !errors.Is(err, ErrSoftRebootNotCapable) {
		t.Fatalf("ApplySoft(required) on an incapable image = %v, want ErrSoftRebootNotCapable", err)
	}
	if st := m.State(); st.Staged == nil || st.Staged.DownloadOnly || st.NextRoot != "" {
		t.Fatalf("after the failed required: staged %+v, nextRoot %q; want unlocked, none prepared", st.Staged, st.NextRoot)
	}
	if err := m.ApplySoft("sometimes"); err == nil {
		t.Fatal("ApplySoft accepted an unknown mode")
	}
	if err := booted(t, refA).ApplySoft(SoftRebootAuto); !errors.Is(err, ErrNoStaged) {
		t.Fatalf("ApplySoft with nothing staged = %v, want ErrNoStaged", err)
	}
}

func TestMachineStaleWindow(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := booted(t, refA)
	m.SetClock(func() time.Time { return now })
	must(t, m.Switch(refB))
	must(t, m.Apply())
	m.Reboot(RebootOptions{StaleFor: time.Minute})
	if got := parse(t, m); got.booted != dA || got.staged != dB {
		t.Fatalf("inside the stale window status = %+v, want the pre-reboot document", got)
	}
	now = now.Add(time.Minute)
	if got := parse(t, m); got != (wantDoc{booted: dB, rollback: dA}) {
		t.Fatalf("after the stale window status = %+v", got)
	}

	must(t, m.Switch(refC))
	must(t, m.Apply())
	m.Reboot(RebootOptions{StaleUntilSettle: true})
	now = now.Add(24 * time.Hour)
	if got := parse(t, m); got.booted != dB {
		t.Fatalf("before settle status = %+v, want pre-reboot", got)
	}
	m.Settle()
	if got := parse(t, m); got.booted != dC {
		t.Fatalf("after settle status = %+v, want booted %s", got, dC)
	}
}

func TestMachineRejects(t *testing.T) {
	tests := []struct {
		name string
		ref  string
		want error
	}{
		{"tag ref", "quay.io/example/os:latest", ErrTagRef},
		{"garbage", "quay.io/example/os; reboot", ErrInvalidRef},
		{"empty", "", ErrInvalidRef},
		{"uppercase digest", "quay.io/example/os@" + strings.ToUpper(dB), ErrInvalidRef},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := booted(t, refA)
			if err := m.Switch(tc.ref); !errors.Is(err, tc.want) {
				t.Fatalf("Switch(%q) = %v, want %v", tc.ref, err, tc.want)
			}
			if got := parse(t, m); got.staged != "" {
				t.Errorf("a rejected switch staged %s", got.staged)
			}
		})
	}
	t.Run("apply with nothing staged", func(t *testing.T) {
		if err := booted(t, refA).Apply(); !errors.Is(err, ErrNoStaged) {
			t.Fatalf("Apply = %v, want ErrNoStaged", err)
		}
	})
}

func TestFailureKnobCountsDown(t *testing.T) {
	m := booted(t, refA)
	m.Configure(func(k *Knobs) { k.SwitchFailure = &Failure{ExitCode: 1, Stderr: "error: pull failed", Times: 2} })
	for i := range 2 {
		var fe *FailureError
		if err := m.Switch(refB); !errors.As(err, &fe) {
			t.Fatalf("switch %d = %v, want the configured failure", i, err)
		}
	}
	must(t, m.Switch(refB))
	if got := parse(t, m); got.staged != dB {
		t.Fatalf("third switch did not stage: %+v", got)
	}
}

func TestMachineConcurrentUse(t *testing.T) {
	m := booted(t, refA)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 50 {
				switch i % 4 {
				case 0:
					_ = m.Switch(refB)
				case 1:
					_ = m.Apply()
				case 2:
					m.Reboot(RebootOptions{})
				default:
					if _, err := bootc.Parse(m.Status()); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	if _, err := bootc.Parse(m.Status()); err != nil {
		t.Fatal(err)
	}
}

func TestNewBootIDFormat(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := NewBootID()
		if !lease.ValidBootID(id) || seen[id] {
			t.Fatalf("boot ID %q invalid or repeated", id)
		}
		seen[id] = true
	}
}

// The schema check is live: a document bootc would never print fails it.
func TestSchemaRejectsBrokenDocument(t *testing.T) {
	schema := compileSchema(t)
	for name, doc := range map[string]string{
		"entry without pinned": `{"apiVersion":"v","kind":"BootcHost","status":{"booted":{"incompatible":false}}}`,
		"timestamp not a time": `{"apiVersion":"v","kind":"BootcHost","status":{"booted":{"incompatible":false,"pinned":false,"image":{"image":{"image":"a","transport":"registry"},"imageDigest":"x","architecture":"amd64","timestamp":"soon"}}}}`,
		"missing kind":         `{"apiVersion":"v"}`,
	} {
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		if schema.Validate(inst) == nil {
			t.Errorf("%s: schema accepted %s", name, doc)
		}
	}
}

// upgraded returns a machine with knobs that booted refA, then staged,
// unlocked and rebooted into refB: booted refB, rollback refA.
func upgraded(t *testing.T, knobs Knobs) *Machine {
	t.Helper()
	m := booted(t, refA)
	m.Configure(func(k *Knobs) { *k = knobs })
	must(t, m.Switch(refB))
	must(t, m.Apply())
	m.Reboot(RebootOptions{})
	return m
}

// rollbackDoc is what a status document says about a rollback.
type rollbackDoc struct {
	booted, staged, rollback string // digests, "" = null
	queued                   bool   // status.rollbackQueued
	bootOrder                string // spec.bootOrder
	rollbackCapable          bool   // status.rollback.softRebootCapable
}

func readRollbackDoc(t *testing.T, doc []byte) rollbackDoc {
	t.Helper()
	s, err := bootc.Parse(doc)
	if err != nil {
		t.Fatalf("bootc.Parse: %v\n%s", err, doc)
	}
	var raw struct {
		Spec struct {
			BootOrder string `json:"bootOrder"`
		} `json:"spec"`
		Status struct {
			RollbackQueued bool `json:"rollbackQueued"`
		} `json:"status"`
	}
	if err := json.Unmarshal(doc, &raw); err != nil {
		t.Fatal(err)
	}
	if raw.Status.RollbackQueued != s.RollbackQueued {
		t.Fatalf("bootc.Parse read rollbackQueued %v, the document says %v", s.RollbackQueued, raw.Status.RollbackQueued)
	}
	d := rollbackDoc{booted: digest(s.Booted), staged: digest(s.Staged), rollback: digest(s.Rollback),
		queued: s.RollbackQueued, bootOrder: raw.Spec.BootOrder}
	if s.Rollback != nil {
		d.rollbackCapable = s.Rollback.SoftRebootCapable
	}
	return d
}

// bootc rollback as crates/lib/src/deploy.rs (rollback) and cli.rs
// (rollback_ostree, handle_soft_reboot) do it, and the reboot after it.
func TestMachineRollback(t *testing.T) {
	capable := Knobs{SoftRebootCapable: true}
	queued := func(rollbackCapable bool) rollbackDoc {
		return rollbackDoc{booted: dB, rollback: dA, queued: true, bootOrder: "rollback", rollbackCapable: rollbackCapable}
	}
	rolledBack := func(rollbackCapable bool) rollbackDoc {
		return rollbackDoc{booted: dA, rollback: dB, bootOrder: "default", rollbackCapable: rollbackCapable}
	}
	tests := []struct {
		name      string
		knobs     Knobs
		mode      SoftRebootMode
		before    func(t *testing.T, m *Machine) // after the upgrade, before the rollback
		wantLines []string
		wantErr   error
		want      rollbackDoc             // right after the rollback
		after     func(m *Machine)        // the boot that follows, if any
		wantAfter rollbackDoc             // after it
		newBoot   bool                    // after changed the boot ID
		softCount uint32                  // soft reboots after
		nextRoot  func(m *Machine) string // the prepared soft-reboot root right after the rollback
	}{
		{name: "rollback queues the rollback deployment and the reboot boots it",
			wantLines: []string{MsgRollbackQueued}, want: queued(false),
			after: reboot, wantAfter: rolledBack(false), newBoot: true},
		{name: "the rollback entry is soft-reboot capable when the image it came from was, before and after",
			knobs: capable, wantLines: []string{MsgRollbackQueued}, want: queued(true),
			after: reboot, wantAfter: rolledBack(true), newBoot: true},
		{name: "a locked staged deployment is discarded",
			before:    func(t *testing.T, m *Machine) { must(t, m.Switch(refC)) },
			wantLines: []string{MsgRollbackQueued}, want: queued(false),
			after: reboot, wantAfter: rolledBack(false), newBoot: true},
		{name: "an unlocked staged deployment is discarded and the reboot boots the rollback",
			before:    func(t *testing.T, m *Machine) { must(t, m.Switch(refC)); must(t, m.Apply()) },
			wantLines: []string{MsgRollbackQueued}, want: queued(false),
			after: reboot, wantAfter: rolledBack(false), newBoot: true},
		{name: "a second rollback reverts the first",
			before: func(t *testing.T, m *Machine) {
				if _, err := m.Rollback(""); err != nil {
					t.Fatal(err)
				}
			},
			wantLines: []string{MsgRollbackReverting, MsgRollbackReverted},
			want:      rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"},
			after:     reboot, wantAfter: rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"}, newBoot: true},
		{name: "a locked stage after the rollback leaves the rollback queued for the reboot",
			after: func(m *Machine) {
				if err := m.Switch(refC); err != nil {
					panic(err)
				}
				m.Reboot(RebootOptions{})
			},
			wantLines: []string{MsgRollbackQueued}, want: queued(false), wantAfter: rolledBack(false), newBoot: true},
		{name: "an unlocked stage after the rollback is what the reboot boots, the booted one its rollback",
			after: func(m *Machine) {
				if err := m.Switch(refC); err != nil {
					panic(err)
				}
				if err := m.Apply(); err != nil {
					panic(err)
				}
				m.Reboot(RebootOptions{})
			},
			wantLines: []string{MsgRollbackQueued}, want: queued(false),
			wantAfter: rollbackDoc{booted: dC, rollback: dB, bootOrder: "default"}, newBoot: true},
		{name: "--soft-reboot=auto prepares a soft reboot into a capable rollback, which enters it",
			knobs: capable, mode: SoftRebootAuto,
			wantLines: []string{MsgRollbackQueued, MsgRollbackSoftReboot}, want: queued(true),
			nextRoot: func(*Machine) string { return dA },
			after:    softReboot, wantAfter: rolledBack(true), softCount: 1},
		{name: "--soft-reboot=required prepares a capable rollback too",
			knobs: capable, mode: SoftRebootRequired,
			wantLines: []string{MsgRollbackQueued, MsgRollbackSoftReboot}, want: queued(true),
			nextRoot: func(*Machine) string { return dA },
			after:    softReboot, wantAfter: rolledBack(true), softCount: 1},
		{name: "--soft-reboot=auto on an incapable rollback prepares nothing: a soft reboot stays on the booted image",
			mode: SoftRebootAuto, wantLines: []string{MsgRollbackQueued}, want: queued(false),
			nextRoot: func(*Machine) string { return "" },
			after:    softReboot, wantAfter: queued(false), softCount: 1},
		{name: "--soft-reboot=required on an incapable rollback fails after queuing it",
			mode: SoftRebootRequired, wantLines: []string{MsgRollbackQueued}, wantErr: ErrRollbackSoftRebootNotCapable, want: queued(false),
			after: reboot, wantAfter: rolledBack(false), newBoot: true},
		{name: "without --soft-reboot nothing is prepared: a soft reboot stays on the booted image",
			knobs: capable, wantLines: []string{MsgRollbackQueued}, want: queued(true),
			nextRoot: func(*Machine) string { return "" },
			after:    softReboot, wantAfter: queued(true), softCount: 1},
		{name: "a full reboot forgets the prepared soft reboot",
			knobs: capable, mode: SoftRebootAuto,
			wantLines: []string{MsgRollbackQueued, MsgRollbackSoftReboot}, want: queued(true),
			after: func(m *Machine) {
				m.Reboot(RebootOptions{})
				if nr := m.State().NextRoot; nr != "" {
					panic("NextRoot " + nr + " after a full reboot")
				}
				m.SoftReboot(RebootOptions{})
			}, wantAfter: rolledBack(true), newBoot: true, softCount: 1},
		{name: "a soft reboot prepared for the staged deployment goes with it",
			knobs: capable,
			before: func(t *testing.T, m *Machine) {
				must(t, m.Switch(refC))
				must(t, m.ApplySoft(SoftRebootAuto))
			},
			wantLines: []string{MsgRollbackQueued}, want: queued(true),
			nextRoot: func(*Machine) string { return "" },
			after:    softReboot, wantAfter: queued(true), softCount: 1},
		{name: "a revert with --soft-reboot prepares the booted deployment, the first in the order",
			knobs: capable, mode: SoftRebootAuto,
			before: func(t *testing.T, m *Machine) {
				if _, err := m.Rollback(""); err != nil {
					t.Fatal(err)
				}
			},
			wantLines: []string{MsgRollbackReverting, MsgRollbackReverted, MsgRollbackSoftReboot},
			want:      rollbackDoc{booted: dB, rollback: dA, bootOrder: "default", rollbackCapable: true},
			nextRoot:  func(*Machine) string { return dB },
			after:     softReboot, wantAfter: rollbackDoc{booted: dB, rollback: dA, bootOrder: "default", rollbackCapable: true}, softCount: 1},
		{name: "a failure fires before anything changes",
			knobs:   Knobs{RollbackFailure: &Failure{ExitCode: 1, Stderr: "error: Rollback: disk on fire\n", Times: 1}},
			wantErr: &FailureError{}, want: rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"},
			after: reboot, wantAfter: rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"}, newBoot: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := upgraded(t, tc.knobs)
			if tc.before != nil {
				tc.before(t, m)
			}
			lines, err := m.Rollback(tc.mode)
			if !errIs(err, tc.wantErr) {
				t.Fatalf("Rollback(%q) = %v, want %v", tc.mode, err, tc.wantErr)
			}
			if !reflect.DeepEqual(lines, tc.wantLines) {
				t.Errorf("Rollback printed %q, want %q", lines, tc.wantLines)
			}
			if got := readRollbackDoc(t, m.Status()); got != tc.want {
				t.Errorf("after the rollback %+v, want %+v", got, tc.want)
			}
			if tc.nextRoot != nil {
				if got, want := m.State().NextRoot, tc.nextRoot(m); got != want {
					t.Errorf("prepared soft-reboot root %q, want %q", got, want)
				}
			}
			if tc.after == nil {
				return
			}
			boot := m.BootID()
			tc.after(m)
			if got := readRollbackDoc(t, m.Status()); got != tc.wantAfter {
				t.Errorf("after the boot %+v, want %+v", got, tc.wantAfter)
			}
			if changed := m.BootID() != boot; changed != tc.newBoot {
				t.Errorf("boot ID changed = %v, want %v", changed, tc.newBoot)
			}
			if got := m.State().SoftRebootCount; got != tc.softCount {
				t.Errorf("SoftRebootCount = %d, want %d", got, tc.softCount)
			}
		})
	}
}

// errIs: err is want (nil for nil; any *FailureError for a *FailureError).
func errIs(err, want error) bool {
	var fe *FailureError
	switch {
	case want == nil:
		return err == nil
	case errors.As(want, &fe):
		return errors.As(err, &fe)
	}
	return errors.Is(err, want)
}

func reboot(m *Machine)     { m.Reboot(RebootOptions{}) }
func softReboot(m *Machine) { m.SoftReboot(RebootOptions{}) }

// No rollback deployment, or nothing booted, is bootc's error and changes
// nothing; a staged deployment stays.
func TestMachineRollbackRefuses(t *testing.T) {
	t.Run("no rollback deployment", func(t *testing.T) {
		m := booted(t, refA)
		must(t, m.Switch(refB))
		lines, err := m.Rollback(SoftRebootAuto)
		if !errors.Is(err, ErrNoRollback) || len(lines) != 0 {
			t.Fatalf("Rollback = %q, %v; want nothing printed and ErrNoRollback", lines, err)
		}
		if got := readRollbackDoc(t, m.Status()); got != (rollbackDoc{booted: dA, staged: dB, bootOrder: "default"}) {
			t.Errorf("after the refused rollback %+v", got)
		}
	})
	t.Run("nothing booted", func(t *testing.T) {
		if _, err := NewMachine(State{}).Rollback(""); !errors.Is(err, ErrNotBooted) {
			t.Fatalf("Rollback = %v, want ErrNotBooted", err)
		}
	})
	t.Run("unknown soft-reboot mode", func(t *testing.T) {
		m := upgraded(t, Knobs{})
		if _, err := m.Rollback("sometimes"); err == nil {
			t.Fatal("Rollback accepted an unknown mode")
		}
		if got := readRollbackDoc(t, m.Status()); got.queued {
			t.Errorf("a refused mode queued the rollback: %+v", got)
		}
	})
}
