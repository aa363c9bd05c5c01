package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
	"unsafe"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/kubectl"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// screen prints log lines and, on a terminal, keeps a table redrawn in
// place below them.
type screen struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	shown []string // the table currently on screen (tty only)
}

func newScreen(w io.Writer, tty bool) *screen { return &screen{w: w, tty: tty} }

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}

// erase removes the table from the screen; the caller holds mu.
func (s *screen) erase() {
	if s.tty && len(s.shown) > 0 {
		fmt.Fprintf(s.w, "\x1b[%dA\x1b[J", len(s.shown))
	}
}

func (s *screen) draw() {
	width := termWidth(s.w)
	for _, l := range s.shown {
		fmt.Fprintf(s.w, "%s\x1b[K\n", fit(l, width-1))
	}
}

// logf prints a line above the table.
func (s *screen) logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.erase()
	fmt.Fprintf(s.w, format+"\n", args...)
	if s.tty {
		s.draw()
	}
}

// table replaces the live table (tty only).
func (s *screen) table(lines []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.erase()
	s.shown = lines
	s.draw()
}

// clearTable removes the live table.
func (s *screen) clearTable() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.erase()
	s.shown = nil
}

// snapshot prints the table once, as log output: a plain periodic
// snapshot, or the last state on a terminal.
func (s *screen) snapshot(lines []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.erase()
	s.shown = nil
	for _, l := range lines {
		fmt.Fprintln(s.w, l)
	}
	fmt.Fprintln(s.w)
}

// snap is what the live table shows, read at one moment.
type snap struct {
	elapsed    time.Duration
	poolName   string
	poolImage  string
	poolTarget string
	pool       fleetv1.BootcNodePoolStatus
	budget     invariant.Pool
	images     map[string]string // tag -> repo@sha256
	nodes      []nodeRow
	// why is `kubectl bootc-fleet status POOL` read in-process: each
	// node's rollout state and live reason.
	why    map[string]kubectl.NodeReport
	recent []string
	err    error
}

type nodeRow struct {
	name, phase, reason string
	booted, staged      string // repo@sha256 or ""
	stagedLocked        bool
	slots               []string
	cordoned, ready     bool
	down                bool
	reboots             int
}

// collect reads the pool, its BootcNodes, Nodes and slot Leases once,
// through the plugin (kubectl.ReadPool), plus what the harness knows
// (reboots, nodes down): the table and the "why" list are composed from
// the same objects, so they show one moment.
func collect(ctx context.Context, f *sim.ProcFleet, start time.Time) snap {
	s := snap{elapsed: time.Since(start), poolName: f.Pool, images: f.Images(), budget: f.Budget()}
	read, err := kubectl.ReadPool(ctx, f.Env.Client, f.Pool, time.Now())
	if err != nil {
		s.err = err
		read = &kubectl.PoolRead{}
	} else {
		p := read.Pool
		s.poolImage, s.poolTarget, s.pool = p.Spec.Image, p.Status.TargetImage, p.Status
		s.why = map[string]kubectl.NodeReport{}
		for _, n := range read.Report.Nodes {
			s.why[n.Name] = n
		}
	}
	slots := slotsHeld(read.Leases)
	reboots := f.Reboots()
	for _, n := range f.Nodes {
		r := nodeRow{name: n.Name, down: n.Down(), reboots: reboots[n.Name], slots: slots[n.Name]}
		if bn := read.BootcNodes[n.Name]; bn != nil {
			st := bn.Status
			r.phase, r.reason = string(st.Phase), st.Reason
			if st.Booted != nil {
				r.booted = st.Booted.Image
			}
			if st.Staged != nil {
				r.staged, r.stagedLocked = st.Staged.Image, st.Staged.DownloadOnly
			}
		}
		if kn := read.Nodes[n.Name]; kn != nil {
			r.cordoned = kn.Spec.Unschedulable
			for _, cond := range kn.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					r.ready = cond.Status == corev1.ConditionTrue
				}
			}
		}
		sort.Strings(r.slots)
		s.nodes = append(s.nodes, r)
	}
	s.recent = narrate(f.Log.Events(), s.images, start, 6)
	return s
}

// slotsHeld lists each holder's slots as kind[:phase].
func slotsHeld(leases []coordinationv1.Lease) map[string][]string {
	slots := map[string][]string{}
	for _, l := range leases {
		g, err := lease.Parse(&l)
		if err != nil {
			continue
		}
		slot := string(g.Kind)
		if g.Phase != "" {
			slot += ":" + string(g.Phase)
		}
		slots[g.Holder] = append(slots[g.Holder], slot)
	}
	return slots
}

// labelOf names a pinned image by the tag it was pushed as: "v2 96ca2e5d".
func labelOf(images map[string]string, pinned string) string {
	if pinned == "" {
		return "-"
	}
	d := pinned
	if at := strings.LastIndex(pinned, "@sha256:"); at >= 0 {
		d = pinned[at+len("@sha256:"):]
	}
	if len(d) > 8 {
		d = d[:8]
	}
	for tag, img := range images {
		if img == pinned {
			return tag + " " + d
		}
	}
	return "? " + d
}

// render lays the snapshot out as lines.
func render(s snap) []string {
	var out []string
	el := s.elapsed.Round(time.Second)
	out = append(out, fmt.Sprintf("── bootc-fleet demo ── pool %s ── elapsed %d:%02d ──", s.poolName, int(el.Minutes()), int(el.Seconds())%60))
	out = append(out, fmt.Sprintf("image %s   target %s   maxUnavailable %d  maxStaging %d",
		orDash(s.poolImage), labelOf(s.images, s.poolTarget), s.budget.MaxUnavailable, s.budget.MaxStaging))
	p := s.pool
	out = append(out, fmt.Sprintf("pool  nodes %d  updated %d  staging %d  staged %d  rebooting %d  waiting %d  degraded %d   %s",
		p.Nodes, p.Updated, p.Staging, p.Staged, p.Rebooting, p.Waiting, p.Degraded, conditions(p.Conditions)))
	if g := gateLine(s); g != "" {
		out = append(out, g)
	}
	// Most wanted columns first: a narrow terminal cuts the line's end.
	row := "%-7s %-10s %-12s %-20s %-16s %-9s %-6s %-7s %s"
	out = append(out, fmt.Sprintf(row, "NODE", "PHASE", "BOOTED", "STAGED", "SLOT", "CORDON", "READY", "REBOOTS", "REASON"))
	for _, n := range s.nodes {
		staged := labelOf(s.images, n.staged)
		if n.staged != "" {
			if n.stagedLocked {
				staged += " locked"
			} else {
				staged += " unlocked"
			}
		}
		phase := orDash(n.phase)
		if n.down {
			phase = "(down)"
		}
		out = append(out, fmt.Sprintf(row, n.name, phase, labelOf(s.images, n.booted), staged,
			orDash(strings.Join(n.slots, ",")), yesNo(n.cordoned, "cordoned", "-"), yesNo(n.ready, "yes", "NO"),
			fmt.Sprint(n.reboots), orDash(n.reason)))
	}
	if len(s.why) > 0 {
		out = append(out, "why (kubectl bootc-fleet status "+s.poolName+"):")
		for _, n := range s.nodes {
			if w, ok := s.why[n.name]; ok {
				out = append(out, fmt.Sprintf("  %-7s %-20s %s", n.name, orDash(w.State), w.Reason))
			}
		}
	}
	if s.err != nil {
		out = append(out, "read error: "+s.err.Error())
	}
	if len(s.recent) > 0 {
		out = append(out, "recent:")
		for _, r := range s.recent {
			out = append(out, "  "+r)
		}
	}
	return out
}

// gateLine says who the canaries of the target are and how far, and what
// is quarantined ("" when neither).
func gateLine(s snap) string {
	var parts []string
	if c := s.pool.Canary; c != nil && c.Target == s.poolTarget && len(c.Nodes) > 0 {
		how := "going first"
		if c.PassedTime != nil {
			how = "passed " + c.PassedTime.Format("15:04:05")
		}
		parts = append(parts, fmt.Sprintf("canary %s (%s)", strings.Join(c.Nodes, ","), how))
	}
	if q := s.pool.Quarantine; q != nil {
		parts = append(parts, fmt.Sprintf("QUARANTINED %s: %s failed its gate (%s)", labelOf(s.images, q.Digest), q.Node, q.Reason))
	}
	if len(parts) == 0 {
		return ""
	}
	return "gate  " + strings.Join(parts, "   ")
}

func conditions(cs []metav1.Condition) string {
	var parts []string
	for _, t := range []string{fleetv1.PoolProgressing, fleetv1.PoolUpToDate, fleetv1.PoolDegraded, fleetv1.PoolHalted} {
		for _, c := range cs {
			if c.Type == t && c.Status == metav1.ConditionTrue {
				parts = append(parts, t+"("+c.Reason+")")
			}
		}
	}
	return strings.Join(parts, " ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

// fit cuts s to n runes (a wrapped line would break the in-place redraw).
func fit(s string, n int) string {
	if n <= 0 || utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

// termWidth is the terminal's width in columns (0 when unknown).
func termWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	var ws struct{ row, col, x, y uint16 }
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws))); e != 0 {
		return 0
	}
	return int(ws.col)
}

// narrate turns the last notable events into sentences, newest last.
func narrate(evs []invariant.Event, images map[string]string, start time.Time, keep int) []string {
	type leaseState struct{ holder, phase string }
	leases := map[string]leaseState{}
	var out []string
	add := func(e invariant.Event, format string, args ...any) {
		out = append(out, fmt.Sprintf("%6.1fs  %s", e.At.Sub(start).Seconds(), fmt.Sprintf(format, args...)))
	}
	for _, e := range evs {
		switch e.Kind {
		case invariant.LeaseVersion:
			prev, now := leases[e.Lease], leaseState{e.Holder, string(e.Phase)}
			leases[e.Lease] = now
			switch {
			case now.holder != "" && prev.holder != now.holder:
				add(e, "%s granted to %s (%s %s)", e.Lease, e.Holder, e.Slot, labelOf(images, e.Image))
			case now.holder == "" && prev.holder != "":
				add(e, "%s released by %s", e.Lease, prev.holder)
			case now.holder != "" && now.phase != prev.phase && now.phase != "":
				add(e, "%s: %s may now %s", e.Lease, e.Holder, strings.ToLower(now.phase))
			}
		case invariant.Cordon:
			add(e, "%s cordoned", e.Node)
		case invariant.Uncordon:
			add(e, "%s uncordoned", e.Node)
		case invariant.StageStart:
			add(e, "%s staging %s", e.Node, labelOf(images, e.Image))
		case invariant.StageEnd:
			add(e, "%s stage of %s ended (%s)", e.Node, labelOf(images, e.Image), e.Detail)
		case invariant.Reboot:
			add(e, "%s rebooting into %s", e.Node, labelOf(images, e.Image))
		case invariant.Boot:
			add(e, "%s up again in boot %.8s", e.Node, e.BootID)
		}
	}
	if len(out) > keep {
		out = out[len(out)-keep:]
	}
	return out
}
