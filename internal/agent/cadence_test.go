package agent

import (
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
)

// The heartbeat pace at the agent's production intervals (no test
// overrides): often enough that the coordinator, which expires a stage
// grant after a lease duration without a report and counts a revoked holder
// still Staging for a lease duration after its last report (amendments 7
// and 8), always sees several reports per lease duration, and often enough
// that a pool names a quiet agent within its --quiet-after of 3 minutes.
func TestReportCadenceAtProductionIntervals(t *testing.T) {
	const coordinatorLease = 2 * time.Minute // the coordinator's default
	var cfg Config
	cfg.defaultIntervals()
	stage := lease.Grant{ID: lease.ID{Lease: "p-stage-0"}, Kind: lease.KindStage, Duration: coordinatorLease}
	for _, c := range []struct {
		name    string
		phase   string
		held    []lease.Grant
		lastD   time.Duration
		atMost  time.Duration
		atLeast time.Duration
	}{
		{"holding a stage grant", "Staging", []lease.Grant{stage}, coordinatorLease, coordinatorLease / lease.HeartbeatsPerLease, time.Second},
		{"revoked but still Staging", "Staging", nil, coordinatorLease, coordinatorLease / lease.HeartbeatsPerLease, time.Second},
		{"waiting for a slot", "Waiting", nil, coordinatorLease, time.Minute, time.Second},
		{"idle", "Idle", nil, coordinatorLease, 5 * time.Minute, 5 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &runner{cfg: cfg}
			r.st.LeaseDuration = c.lastD
			for _, g := range c.held {
				r.st.Grants = append(r.st.Grants, decide.HeldGrant{Grant: g})
			}
			got := r.reportEvery(c.phase)
			if got > c.atMost || got < c.atLeast {
				t.Fatalf("reportEvery(%s) = %s, want within [%s, %s]", c.phase, got, c.atLeast, c.atMost)
			}
			// Margin: a full lease duration holds at least 3 reports beyond
			// the one that might be lost, for every phase with a grant.
			if c.phase == "Staging" && coordinatorLease/got < 4 {
				t.Fatalf("only %d reports per lease duration", coordinatorLease/got)
			}
		})
	}
}
