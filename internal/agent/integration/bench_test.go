package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

// BenchmarkAgentIdle measures what the real agent binary costs a node when
// nothing is happening: resident memory once it is ready, and CPU time over
// an idle window (IDLE_SECONDS, default 60), with the production poll
// interval (1m) and a 2s watchdog (a ping every second). The node waits for
// a stage grant that never comes (phase Waiting: a status report every minute,
// ActiveReportInterval), the busiest idle state. It reports rss_MiB (once
// ready), peak_rss_MiB (VmHWM at the end), cpu_ms/idle_min and cpu_% (of
// one core over the window) and prints them with the goals (RSS < 25 MB,
// idle CPU < 0.1%); ns/op is the window itself and means nothing.
func BenchmarkAgentIdle(b *testing.B) {
	window := 60 * time.Second
	if v, err := strconv.Atoi(os.Getenv("IDLE_SECONDS")); err == nil && v > 0 {
		window = time.Duration(v) * time.Second
	}
	for b.Loop() {
		n := newNode(b, "idle-node")
		n.poll = "1m" // the production default
		n.start()
		if _, err := n.k.WaitStatus(b.Context(), n.name, testcoord.PhaseIs(fleetv1.PhaseWaiting, "")); err != nil {
			b.Fatal(err)
		}
		pid := n.cmd.Process.Pid
		rssReady := rssKiB(b, pid)
		cpu0 := cpuTicks(b, pid)
		inv0, _ := n.dir.Invocations()
		time.Sleep(window)
		cpu1 := cpuTicks(b, pid)
		inv1, _ := n.dir.Invocations()
		b.ReportMetric(float64(len(inv1)-len(inv0))/window.Minutes(), "bootc_calls/idle_min")
		rssEnd := rssKiB(b, pid)
		peak := statusKiB(b, pid, "VmHWM:")
		const ticksPerSecond = 100 // USER_HZ on Linux
		cpuMs := float64(cpu1-cpu0) * 1000 / ticksPerSecond
		pct := 100 * cpuMs / float64(window.Milliseconds())
		b.ReportMetric(float64(rssReady)/1024, "rss_MiB")
		b.ReportMetric(float64(rssEnd)/1024, "rss_end_MiB")
		b.ReportMetric(float64(peak)/1024, "peak_rss_MiB")
		b.ReportMetric(cpuMs/window.Minutes(), "cpu_ms/idle_min")
		b.ReportMetric(pct, "cpu_%")
		fmt.Fprintf(os.Stderr, "agent idle: RSS %.1f MiB once ready (goal < 25 MB), %.1f MiB after %s, peak %.1f MiB; CPU %.0f ms over %s = %.3f%% of one core (goal < 0.1%%; clock ticks of 10 ms); %d bootc calls\n",
			float64(rssReady)/1024, float64(rssEnd)/1024, window, float64(peak)/1024, cpuMs, window, pct, len(inv1)-len(inv0))
	}
}

func rssKiB(tb testing.TB, pid int) int64 { return statusKiB(tb, pid, "VmRSS:") }

// statusKiB is a field of /proc/<pid>/status in KiB (VmRSS:, VmHWM:).
func statusKiB(tb testing.TB, pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	tb.Fatal("no " + field)
	return 0
}

// cpuTicks is utime+stime of pid, in clock ticks.
func cpuTicks(tb testing.TB, pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name (which may contain spaces) start at ")".
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(rest[11], 10, 64)
	stime, _ := strconv.ParseInt(rest[12], 10, 64)
	return utime + stime
}
