// Command fake-host-bus runs a private D-Bus with fake logind and systemd
// for a simulated node: it prints the bus address (use it as
// DBUS_SYSTEM_BUS_ADDRESS), records reboots to a marker file and runs a
// command on each, so a harness can play the node's reboot.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/sim/fakedbus"
)

type strList []string

func (l *strList) String() string     { return strings.Join(*l, " ") }
func (l *strList) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var (
		dir         = flag.String("dir", "", "directory for the bus config (default: a new temp dir)")
		addressFile = flag.String("address-file", "", "also write the bus address to this file")
		marker      = flag.String("marker", "", "append one line per reboot/soft-reboot/poweroff to this file")
		onReboot    = flag.String("on-reboot", "", "program to start on logind Reboot (no shell)")
		onSoft      = flag.String("on-soft-reboot", "", "program to start on a soft reboot (logind RebootWithFlags(SD_LOGIND_SOFT_REBOOT) or StartUnit(soft-reboot.target))")
		softCount   = flag.Uint("soft-reboots-count", 0, "initial SoftRebootsCount")
		noSoftCount = flag.Bool("no-soft-reboots-count", false, "omit SoftRebootsCount and logind's soft-reboot flag, like systemd 252")
		jobResult   = flag.String("job-result", "done", "result of every systemd job")
		rebootArgs  strList
		softArgs    strList
	)
	flag.Var(&rebootArgs, "on-reboot-arg", "argument for --on-reboot (repeatable)")
	flag.Var(&softArgs, "on-soft-reboot-arg", "argument for --on-soft-reboot (repeatable)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "fake-host-bus: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	if err := run(*dir, *addressFile, *marker, *onReboot, rebootArgs, *onSoft, softArgs, uint32(*softCount), *noSoftCount, *jobResult); err != nil {
		fmt.Fprintf(os.Stderr, "fake-host-bus: %v\n", err)
		os.Exit(1)
	}
}

func run(dir, addressFile, marker, onReboot string, rebootArgs []string, onSoft string, softArgs []string,
	softCount uint32, noSoftCount bool, jobResult string) error {
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	if dir == "" {
		d, err := os.MkdirTemp("", "fake-host-bus")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	addr, stop, err := fakedbus.StartBusProcess(startCtx, dir)
	cancel()
	if err != nil {
		return err
	}
	defer stop()

	record := (&markerFile{path: marker}).record

	sd := &fakedbus.Systemd1{SoftRebootsCount: softCount, OmitSoftRebootsCount: noSoftCount, JobResult: jobResult}
	softReboot := func() {
		record("soft-reboot")
		startProgram(onSoft, softArgs)
		// The count the next userspace will read.
		sd.SetSoftRebootsCount(sd.CurrentSoftRebootsCount() + 1)
	}
	// A soft reboot comes through logind (as `systemctl soft-reboot` and
	// the agent ask for it) or straight from starting the target.
	sd.OnSoftReboot = softReboot
	l1 := &fakedbus.Login1{
		OnReboot:     func() { record("reboot"); startProgram(onReboot, rebootArgs) },
		OnSoftReboot: softReboot,
		OnPowerOff:   func() { record("poweroff") },
		NoSoftReboot: noSoftCount,
	}
	if err := sd.Serve(addr); err != nil {
		return err
	}
	defer sd.Close()
	if err := l1.Serve(addr); err != nil {
		return err
	}
	defer l1.Close()

	if err := writeAddress(addressFile, addr); err != nil {
		return err
	}
	fmt.Println(addr)
	<-ctx.Done()
	return nil
}

// markerFile appends one line per event to path (nothing when path is "").
type markerFile struct {
	path string
	mu   sync.Mutex
}

func (m *markerFile) record(event string) {
	if m.path == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f, err := os.OpenFile(m.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fake-host-bus: marker: %v\n", err)
		return
	}
	fmt.Fprintf(f, "%s %s\n", event, time.Now().UTC().Format(time.RFC3339Nano))
	f.Close()
}

// startProgram starts prog with args (nothing when prog is "") and does not
// wait for it.
func startProgram(prog string, args []string) {
	if prog == "" {
		return
	}
	cmd := exec.Command(prog, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "fake-host-bus: %s: %v\n", prog, err)
		return
	}
	go cmd.Wait()
}

// writeAddress writes the bus address to path atomically (nothing when path
// is "").
func writeAddress(path, addr string) error {
	if path == "" {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
