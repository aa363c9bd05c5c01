package controller

import (
	"testing"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The planner's waves (amendment 26) read the Node's zone label and whether
// it carries the canary label, whatever its value (an empty one too).
func TestPlanNodeReadsZoneAndCanary(t *testing.T) {
	for _, tt := range []struct {
		name       string
		labels     map[string]string
		zone       string
		wantCanary bool
	}{
		{"neither", map[string]string{"pool": "a"}, "", false},
		{"zone", map[string]string{fleetv1.LabelZone: "eu-1a"}, "eu-1a", false},
		{"canary with an empty value", map[string]string{fleetv1.LabelCanary: ""}, "", true},
		{"both", map[string]string{fleetv1.LabelCanary: "true", fleetv1.LabelZone: "eu-1b"}, "eu-1b", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := kubeletNode()
			n.Labels = tt.labels
			pn := planNode(n, true, nil)
			if pn.Zone != tt.zone || pn.Canary != tt.wantCanary {
				t.Errorf("planNode: zone %q canary %v, want %q %v", pn.Zone, pn.Canary, tt.zone, tt.wantCanary)
			}
		})
	}
}
