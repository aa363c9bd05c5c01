package health

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// MaxMessage bounds a Result's message (the pool's quarantine message is at
// most 1024 bytes).
const MaxMessage = 1024

// maxListed bounds how many units, pods or series a message names.
const maxListed = 5

var (
	bootIDPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	// unitPattern is the CRD's pattern for a unit name (requiredUnits).
	unitPattern        = regexp.MustCompile(`^[A-Za-z0-9:_.\\@-]+\.(service|socket|target|mount|path|timer|scope|slice|swap|device|automount)$`)
	activeStatePattern = regexp.MustCompile(`^$|^[a-z]+$`)
)

// Host evaluates the host check from the node's status.host, as of the
// node's current boot: the kubelet's boot ID and the soft-reboot count the
// agent reports in its BootcNode status (amendment 24). A report from
// another boot counts as none (I5); a report the schema let through but
// that makes no sense does not pass either, and says why.
func Host(spec *fleetv1.HostHealthCheck, st *fleetv1.HostHealth, kubeletBootID string, softRebootCount int64) Result {
	r := Result{Check: CheckHost}
	if spec == nil {
		r.Pass = true
		return r
	}
	fail := func(reason, msg string) Result {
		r.Reason, r.Message = reason, text.Truncate(msg, MaxMessage)
		return r
	}
	if st == nil {
		return fail(fleetv1.ReasonHostNotReported, "the agent reported no host health (status.host)")
	}
	if err := validHost(st); err != "" {
		return fail(fleetv1.ReasonHostNotReported, "status.host is not valid: "+err)
	}
	if st.BootID != kubeletBootID || st.SoftRebootCount != softRebootCount {
		return fail(fleetv1.ReasonHostNotReported, fmt.Sprintf("status.host was read in boot %s (soft reboot %d), not in the node's current boot %s (soft reboot %d)",
			st.BootID, st.SoftRebootCount, text.Truncate(kubeletBootID, 64), softRebootCount))
	}
	switch st.SystemState {
	case fleetv1.SystemRunning:
		if st.FailedUnitsTotal > 0 {
			// Read a moment apart: a unit failed in between. Not healthy.
			return fail(fleetv1.ReasonHostUnitFailed, "systemd reports running but "+failedUnits(st))
		}
	case fleetv1.SystemDegraded:
		if !spec.AllowDegraded {
			return fail(fleetv1.ReasonHostUnitFailed, "systemd is degraded: "+failedUnits(st))
		}
	default:
		msg := fmt.Sprintf("systemd is %s, not running", st.SystemState)
		if st.FailedUnitsTotal > 0 {
			msg += "; " + failedUnits(st)
		}
		return fail(fleetv1.ReasonHostNotRunning, msg)
	}
	if msg := inactiveUnits(spec.RequiredUnits, st.Units); msg != "" {
		return fail(fleetv1.ReasonHostUnitInactive, msg)
	}
	if spec.RequireBootComplete && st.BootComplete != "active" {
		state := st.BootComplete
		if state == "" {
			state = "not loaded"
		}
		msg := "boot-complete.target is " + state + ", not active"
		if st.FailedUnitsTotal > 0 {
			msg += "; " + failedUnits(st)
		}
		return fail(fleetv1.ReasonHostBootIncomplete, msg)
	}
	r.Pass = true
	return r
}

// validHost checks what the schema cannot: the lists are sorted and
// consistent with their total, and every name and state is one systemd
// could have reported. "" means valid.
func validHost(st *fleetv1.HostHealth) string {
	if !bootIDPattern.MatchString(st.BootID) {
		return fmt.Sprintf("bootID %q is not a boot ID", text.Truncate(st.BootID, 64))
	}
	if st.SoftRebootCount < 0 || st.SoftRebootCount > 1<<32-1 {
		return fmt.Sprintf("softRebootCount %d is out of range", st.SoftRebootCount)
	}
	switch st.SystemState {
	case fleetv1.SystemInitializing, fleetv1.SystemStarting, fleetv1.SystemRunning, fleetv1.SystemDegraded,
		fleetv1.SystemMaintenance, fleetv1.SystemStopping, fleetv1.SystemOffline, fleetv1.SystemUnknown:
	default:
		return fmt.Sprintf("systemState %q is not a systemd state", text.Truncate(string(st.SystemState), 32))
	}
	if len(st.FailedUnits) > fleetv1.MaxFailedUnits {
		return fmt.Sprintf("%d failedUnits, at most %d", len(st.FailedUnits), fleetv1.MaxFailedUnits)
	}
	if int64(st.FailedUnitsTotal) < int64(len(st.FailedUnits)) || st.FailedUnitsTotal > 1000000 {
		return fmt.Sprintf("failedUnitsTotal %d does not count the %d failedUnits listed", st.FailedUnitsTotal, len(st.FailedUnits))
	}
	if st.FailedUnitsTotal > int32(len(st.FailedUnits)) && len(st.FailedUnits) < fleetv1.MaxFailedUnits {
		return fmt.Sprintf("failedUnitsTotal %d but only %d failedUnits listed", st.FailedUnitsTotal, len(st.FailedUnits))
	}
	for i, u := range st.FailedUnits {
		if !unitPattern.MatchString(u) || len(u) > 255 {
			return fmt.Sprintf("failedUnits[%d] %q is not a unit name", i, text.Truncate(u, 64))
		}
		if i > 0 && st.FailedUnits[i-1] >= u {
			return "failedUnits are not sorted and unique"
		}
	}
	if !activeStatePattern.MatchString(st.BootComplete) || len(st.BootComplete) > 32 {
		return fmt.Sprintf("bootComplete %q is not a unit state", text.Truncate(st.BootComplete, 32))
	}
	if len(st.Units) > fleetv1.MaxRequiredUnits {
		return fmt.Sprintf("%d units, at most %d", len(st.Units), fleetv1.MaxRequiredUnits)
	}
	seen := map[string]bool{}
	for i, u := range st.Units {
		if !unitPattern.MatchString(u.Name) || len(u.Name) > 255 || seen[u.Name] {
			return fmt.Sprintf("units[%d] %q is not a unit name, or named twice", i, text.Truncate(u.Name, 64))
		}
		seen[u.Name] = true
		if !activeStatePattern.MatchString(u.ActiveState) || len(u.ActiveState) > 32 {
			return fmt.Sprintf("units[%d] %s: activeState %q is not a unit state", i, u.Name, text.Truncate(u.ActiveState, 32))
		}
	}
	return ""
}

// failedUnits names the failed units, at most maxListed, and counts them.
func failedUnits(st *fleetv1.HostHealth) string {
	n := int(st.FailedUnitsTotal)
	if n == 0 {
		return "no failed unit listed"
	}
	return fmt.Sprintf("%d failed: %s", n, listed(st.FailedUnits, n))
}

// inactiveUnits names the required units that are not active ("" if none).
func inactiveUnits(required []string, units []fleetv1.UnitState) string {
	var bad []string
	for _, name := range required {
		i := slices.IndexFunc(units, func(u fleetv1.UnitState) bool { return u.Name == name })
		switch {
		case i < 0:
			bad = append(bad, name+" (not reported)")
		case units[i].ActiveState == "":
			bad = append(bad, name+" (not loaded)")
		case units[i].ActiveState != "active":
			bad = append(bad, name+" ("+units[i].ActiveState+")")
		}
	}
	if len(bad) == 0 {
		return ""
	}
	return "required units not active: " + listed(bad, len(bad))
}

// listed joins the first maxListed names and says how many more there are
// of total.
func listed(names []string, total int) string {
	shown := names[:min(len(names), maxListed)]
	s := strings.Join(shown, ", ")
	if more := total - len(shown); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}
