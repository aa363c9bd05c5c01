package plan

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

func win(start string, dur time.Duration, tz string, days ...fleetv1.Weekday) fleetv1.MaintenanceWindow {
	return fleetv1.MaintenanceWindow{Start: start, Duration: metav1.Duration{Duration: dur}, TimeZone: tz, Days: days}
}

func at(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMaintenanceWindows(t *testing.T) {
	const berlin = "Europe/Berlin"
	for _, c := range []struct {
		name    string
		ws      []fleetv1.MaintenanceWindow
		now     string
		open    bool
		edge    string // until when open, next when closed ("" none)
		errPart string
	}{
		{"no windows: always open", nil, "2026-12-01T10:00:00Z", true, "", ""},
		{"inside a daily UTC window", []fleetv1.MaintenanceWindow{win("02:00", 4*time.Hour, "")}, "2026-12-01T03:00:00Z", true, "2026-12-01T06:00:00Z", ""},
		{"at the opening instant", []fleetv1.MaintenanceWindow{win("02:00", 4*time.Hour, "")}, "2026-12-01T02:00:00Z", true, "2026-12-01T06:00:00Z", ""},
		{"at the closing instant: closed", []fleetv1.MaintenanceWindow{win("02:00", 4*time.Hour, "")}, "2026-12-01T06:00:00Z", false, "2026-12-02T02:00:00Z", ""},
		{"before today's window", []fleetv1.MaintenanceWindow{win("02:00", 4*time.Hour, "")}, "2026-12-01T01:00:00Z", false, "2026-12-01T02:00:00Z", ""},
		{"spans midnight: open after it", []fleetv1.MaintenanceWindow{win("22:00", 4*time.Hour, "")}, "2026-12-02T01:30:00Z", true, "2026-12-02T02:00:00Z", ""},
		{"spans midnight from a listed day into an unlisted one", []fleetv1.MaintenanceWindow{win("22:00", 4*time.Hour, "", "Tuesday")}, "2026-12-02T01:30:00Z", true, "2026-12-02T02:00:00Z", ""}, // 1 Dec 2026 is a Tuesday
		{"only on listed days", []fleetv1.MaintenanceWindow{win("02:00", time.Hour, "", "Saturday", "Sunday")}, "2026-12-01T02:30:00Z", false, "2026-12-05T02:00:00Z", ""},
		{"in its own time zone", []fleetv1.MaintenanceWindow{win("02:00", time.Hour, berlin)}, "2026-12-01T01:30:00Z", true, "2026-12-01T02:00:00Z", ""}, // CET = UTC+1
		{"the earliest of several next openings", []fleetv1.MaintenanceWindow{win("20:00", time.Hour, ""), win("12:00", time.Hour, "")}, "2026-12-01T10:00:00Z", false, "2026-12-01T12:00:00Z", ""},
		{"overlapping windows: open until the later end", []fleetv1.MaintenanceWindow{win("01:00", 2*time.Hour, ""), win("02:00", 3*time.Hour, "")}, "2026-12-01T02:30:00Z", true, "2026-12-01T05:00:00Z", ""},
		{"a week-long window", []fleetv1.MaintenanceWindow{win("00:00", 168*time.Hour, "", "Monday")}, "2026-12-06T23:00:00Z", true, "2026-12-07T00:00:00Z", ""},
		// DST in Berlin: 29 Mar 2026 02:00 CET -> 03:00 CEST; 25 Oct 2026 03:00 CEST -> 02:00 CET.
		{"spring forward: 02:30 does not exist, opens 03:30 CEST", []fleetv1.MaintenanceWindow{win("02:30", time.Hour, berlin)}, "2026-03-29T01:00:00Z", false, "2026-03-29T01:30:00Z", ""},
		{"spring forward: the window lasts its elapsed duration", []fleetv1.MaintenanceWindow{win("01:00", 3*time.Hour, berlin)}, "2026-03-29T02:30:00Z", true, "2026-03-29T03:00:00Z", ""},         // 01:00 CET = 00:00Z, +3h
		{"fall back: the day before the change", []fleetv1.MaintenanceWindow{win("02:00", time.Hour, berlin)}, "2026-10-24T00:30:00Z", true, "2026-10-24T01:00:00Z", ""},                            // CEST = UTC+2
		{"fall back: the day after the change", []fleetv1.MaintenanceWindow{win("02:00", time.Hour, berlin)}, "2026-10-26T01:30:00Z", true, "2026-10-26T02:00:00Z", ""},                             // CET = UTC+1
		{"fall back: a window over the repeated hour lasts its duration", []fleetv1.MaintenanceWindow{win("01:30", 2*time.Hour, berlin)}, "2026-10-25T00:45:00Z", true, "2026-10-25T01:30:00Z", ""}, // 01:30 CEST = 23:30Z
		{"unknown time zone: closed, named", []fleetv1.MaintenanceWindow{win("02:00", time.Hour, "Mars/Olympus")}, "2026-12-01T02:30:00Z", false, "", `spec.rollout.windows[0]: unknown time zone "Mars/Olympus"`},
		{"Local is no IANA zone: closed, named", []fleetv1.MaintenanceWindow{win("02:00", time.Hour, "Local")}, "2026-12-01T02:30:00Z", false, "", `spec.rollout.windows[0]: time zone "Local" is the coordinator's own zone, not an IANA name`},
		{"bad start", []fleetv1.MaintenanceWindow{win("2:00", time.Hour, "")}, "2026-12-01T02:30:00Z", false, "", `start "2:00" is not HH:MM`},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := evalWindows(c.ws, at(t, c.now))
			if c.errPart != "" {
				if st.err == nil || !strings.Contains(st.err.Error(), c.errPart) || st.open {
					t.Fatalf("state %+v, want closed with error %q", st, c.errPart)
				}
				return
			}
			if st.err != nil || st.open != c.open {
				t.Fatalf("open %v err %v, want open %v", st.open, st.err, c.open)
			}
			edge := st.next
			if st.open {
				edge = st.until
			}
			want := time.Time{}
			if c.edge != "" {
				want = at(t, c.edge)
			}
			if !edge.Equal(want) {
				t.Fatalf("edge %s, want %s", edge.UTC().Format(time.RFC3339), c.edge)
			}
		})
	}
}
