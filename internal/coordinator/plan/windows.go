package plan

import (
	"fmt"
	"strings"
	"time"

	// The coordinator's image has no /usr/share/zoneinfo: embed the IANA
	// database, so spec.rollout.windows[].timeZone means the same anywhere.
	_ "time/tzdata"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// windowState is what a pool's maintenance windows say at one instant.
type windowState struct {
	// configured: the pool has windows; without any, grants may go at any time.
	configured bool
	open       bool
	// until: while open, when the last window open now closes.
	until time.Time
	// next: while closed, when the next window opens (zero: none in the
	// next 8 days, i.e. none can open).
	next time.Time
	// err names a window that cannot be read (an unknown time zone); all
	// windows then count as closed, so nothing is granted by mistake.
	err error
}

// evalWindows evaluates ws at now. A window opens on each of its days at
// its start, local time in its zone, and stays open for its duration
// (elapsed time), so a window that opens late in the evening is open after
// midnight too: the days before now are checked as well as today.
func evalWindows(ws []fleetv1.MaintenanceWindow, now time.Time) windowState {
	st := windowState{configured: len(ws) > 0}
	if !st.configured {
		st.open = true
		return st
	}
	for i, w := range ws {
		opens, err := windowOpenings(w, now)
		if err != nil {
			return windowState{configured: true, err: fmt.Errorf("spec.rollout.windows[%d]: %w", i, err)}
		}
		for _, o := range opens {
			end := o.Add(w.Duration.Duration)
			switch {
			case !o.After(now) && now.Before(end):
				st.open = true
				if end.After(st.until) {
					st.until = end
				}
			case o.After(now) && (st.next.IsZero() || o.Before(st.next)):
				st.next = o
			}
		}
	}
	if st.open {
		st.next = time.Time{}
	}
	return st
}

// windowOpenings lists the window's openings from 8 days before now to 8
// days after: every opening that can cover now (durations are at most 7
// days) and the next one.
func windowOpenings(w fleetv1.MaintenanceWindow, now time.Time) ([]time.Time, error) {
	loc := time.UTC
	if w.TimeZone == "Local" {
		// time.LoadLocation("Local") is the process's own zone: the
		// coordinator's, or the plugin user's. A window means one instant.
		return nil, fmt.Errorf("time zone %q is the coordinator's own zone, not an IANA name", w.TimeZone)
	}
	if w.TimeZone != "" {
		l, err := time.LoadLocation(w.TimeZone)
		if err != nil {
			return nil, fmt.Errorf("unknown time zone %q", w.TimeZone)
		}
		loc = l
	}
	var hh, mm int
	if n, err := fmt.Sscanf(w.Start, "%2d:%2d", &hh, &mm); n != 2 || err != nil || len(w.Start) != 5 || hh > 23 || mm > 59 || hh < 0 || mm < 0 {
		return nil, fmt.Errorf("start %q is not HH:MM", w.Start)
	}
	if d := w.Duration.Duration; d <= 0 || d > 7*24*time.Hour {
		return nil, fmt.Errorf("duration %s is not within (0, 168h]", d)
	}
	days := map[time.Weekday]bool{}
	for _, d := range w.Days {
		wd, ok := weekdays[strings.ToLower(string(d))]
		if !ok {
			return nil, fmt.Errorf("day %q is not a weekday name", d)
		}
		days[wd] = true
	}
	local := now.In(loc)
	var out []time.Time
	for d := -8; d <= 8; d++ {
		// The calendar day first (at noon, clear of any DST change), then
		// the opening on it: time.Date normalizes a time a DST change skips.
		day := time.Date(local.Year(), local.Month(), local.Day()+d, 12, 0, 0, 0, loc)
		if len(days) > 0 && !days[day.Weekday()] {
			continue
		}
		out = append(out, time.Date(day.Year(), day.Month(), day.Day(), hh, mm, 0, 0, loc))
	}
	return out, nil
}

var weekdays = func() map[string]time.Weekday {
	m := map[string]time.Weekday{}
	for d := time.Sunday; d <= time.Saturday; d++ {
		m[strings.ToLower(d.String())] = d
	}
	return m
}()

// describe is the window part of a condition message.
func (w windowState) describe() string {
	switch {
	case w.err != nil:
		return w.err.Error() + "; no new grants that need a window until it is fixed"
	case w.open:
		return "a maintenance window is open until " + w.until.UTC().Format(time.RFC3339)
	case w.next.IsZero():
		return "outside the maintenance windows; none opens in the next 8 days"
	default:
		return "outside the maintenance windows; the next opens at " + w.next.UTC().Format(time.RFC3339)
	}
}
