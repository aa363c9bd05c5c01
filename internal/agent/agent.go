// Package agent runs bootc-fleet-agent: a loop that observes the host and the
// API server, feeds what it saw into decide.Step, runs the effects Step
// returns (feeding each result back in) and reports.
//
// Run is embeddable: it takes its host edges as narrow interfaces (Deps), has
// no globals, never exits the process and logs through the logger it is
// given, so many agents can run in one process against in-memory hosts.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/record"
)

// Bootc runs the bootc CLI (internal/agent/bootc.CLI in production).
type Bootc interface {
	Status(ctx context.Context) (bootc.Status, error)
	// Probe learns what the installed bootc supports.
	Probe(ctx context.Context) (bootc.Capabilities, error)
	// Stage stages exactly img, locked (download-only), with a sequence
	// caps allow (with bootc's signature enforcement when opts say so);
	// cancelling ctx stops it.
	Stage(ctx context.Context, img imageref.Pinned, caps bootc.Capabilities, opts bootc.StageOptions) error
	// ApplyStaged unlocks the staged deployment (upgrade --from-downloaded)
	// and, with a soft-reboot mode, prepares a soft reboot into it
	// (--soft-reboot=auto) when bootc says it is capable.
	ApplyStaged(ctx context.Context, mode bootc.SoftReboot) error
	// Rollback queues the rollback deployment, which must be to, for the
	// next boot (`bootc rollback`, with a soft-reboot mode preparing a soft
	// reboot into it when bootc says it is capable); it never reverts a
	// rollback already queued.
	Rollback(ctx context.Context, to imageref.Pinned, mode bootc.SoftReboot) (bootc.RollbackResult, error)
}

// Host is the machine: its boot identity and its reboot.
type Host interface {
	// BootID is the current /proc/sys/kernel/random/boot_id.
	BootID() (string, error)
	// SoftRebootsCount is systemd's counter; supported is false on a
	// systemd without it (then the count is 0 and soft reboot is not offered).
	SoftRebootsCount(ctx context.Context) (count uint32, supported bool, err error)
	// Reboot and SoftReboot ask logind (Reboot, RebootWithFlags with
	// SD_LOGIND_SOFT_REBOOT) and return once it accepted.
	Reboot(ctx context.Context) error
	SoftReboot(ctx context.Context) error
}

// Notifier is sd_notify.
type Notifier interface {
	Ready() error
	Status(line string) error
	Watchdog() error
	Stopping() error
	// WatchdogInterval is WATCHDOG_USEC for this process, if enabled.
	WatchdogInterval() (time.Duration, bool)
}

// Records is the durable state (record.Store in production).
type Records interface {
	Read() (*record.Record, error)
	Write(record.Record) error
	Clear() error
	Spent() ([]lease.ID, error)
	AddSpent(lease.ID) error
}

// API is the agent's view of the API server: its own BootcNode and the
// Leases labelled with its name (informers in production), consistent
// reads of one Lease, and merge patches of its own BootcNode's status. The
// agent writes nothing else (docs/design.md, amendment 8).
type API interface {
	// Start runs the informers until ctx ends.
	Start(ctx context.Context)
	// Synced: the BootcNode and the Leases were listed at least once.
	Synced() bool
	// Changed receives when the BootcNode's spec or a Lease changed.
	Changed() <-chan struct{}
	// BootcNode is the cached BootcNode, or nil.
	BootcNode() *fleetv1.BootcNode
	// Leases are the cached Leases labelled with this node.
	Leases() []*coordinationv1.Lease
	// SlotsError says why the Leases the BootcNode names are not watched
	// (a malformed fleet.bootc.dev/slots annotation), or nil.
	SlotsError() error
	// ReadLease is a consistent read (a GET answered from etcd).
	ReadLease(ctx context.Context, name string) (*coordinationv1.Lease, error)
	// PatchStatus sends a merge patch to this node's BootcNode status.
	PatchStatus(ctx context.Context, body []byte) error
	// ListErrors are the current list/watch failures, by informer.
	ListErrors() map[string]error
	// ClearListError forgets an informer's failure once a later request
	// shows access works again.
	ClearListError(informer string)
	// Host is the API server's address, for messages.
	Host() string
}

// Deps are the host edges Run uses.
type Deps struct {
	// API may be nil: then the API server at Config.RESTConfig.
	API   API
	Bootc Bootc
	Host  Host
	// Notifier may be nil (no sd_notify).
	Notifier Notifier
	// Records may be nil: then record.Store{Dir: Config.StateDir}.
	Records Records
	// Clock may be nil: the real clock.
	Clock clock.Clock
	// Log may be nil: discard.
	Log *slog.Logger
	// Changes may be nil; a receive means the bootc status may have changed
	// (file system events on the deployment directories).
	Changes <-chan struct{}
	// Trace may be nil; it is called right before each disruptive step,
	// after the step's grant was confirmed, and when a stage ends (see
	// Step).
	Trace func(Step)
}

// Step is a disruptive step the agent is about to take, or the end of a
// stage it ran: Kind is "stage", "apply", "reboot" or "soft-reboot" (the
// decide.Step* names), or StepStageEnded. A disruptive step is taken only
// after a consistent read of the grant's Lease (a GET without
// resourceVersion, answered from etcd) showed exactly this grant: the API
// server held it at that moment. ResourceVersion is the version that read
// returned. NewTraceWriter writes steps as JSON lines (--trace-file).
type Step struct {
	Time            time.Time `json:"time"`
	Kind            string    `json:"kind"`
	Lease           string    `json:"lease,omitempty"`
	ResourceVersion string    `json:"resourceVersion,omitempty"`
	Grant           lease.ID  `json:"grant,omitzero"`
	Image           string    `json:"image"`
	BootID          string    `json:"bootID,omitempty"`
	SoftRebootCount uint32    `json:"softRebootCount,omitempty"`
	// Outcome (StepStageEnded only): one of the Stage* outcomes.
	Outcome string `json:"outcome,omitempty"`
}

// StepStageEnded is the Kind of the Step that says a stage the agent ran is
// over; no grant is confirmed for it.
const StepStageEnded = "stage-ended"

// How a stage ended (Step.Outcome).
const (
	StageFinished  = "finished"
	StageFailed    = "failed"
	StageRejected  = "rejected"
	StageCancelled = "cancelled"
)

// Config is the agent's configuration.
type Config struct {
	// NodeName is this node's name: its BootcNode's name and the holder of
	// its grants.
	NodeName string
	// RESTConfig reaches the API server as this node (when Deps.API is nil).
	RESTConfig *rest.Config
	// StateDir holds the reboot record (when Deps.Records is nil).
	StateDir string
	// PollInterval re-reads everything even without events. Default 1m.
	PollInterval time.Duration
	// SettleTimeout is how long after a reboot a status that still shows
	// the old image is re-read before BootedUnexpectedImage. Default 2m.
	SettleTimeout time.Duration
	// RebootTimeout is how long a recorded reboot may take before
	// RebootDidNotHappen. Default 15m.
	RebootTimeout time.Duration
	// RereadInterval is the delay between re-reads of an untrustworthy
	// status. Default 2s.
	RereadInterval time.Duration
	// ReportInterval is the longest time between two status reports when
	// nothing changes and the node has no rollout work. Default 5m.
	ReportInterval time.Duration
	// ActiveReportInterval is the longest time between two reports while
	// the node has rollout work (any phase but Idle). While the agent holds
	// a grant it also reports lease.HeartbeatsPerLease times per lease
	// duration. Default 1m: at 5,000 nodes waiting for a slot that is 83
	// status writes a second, not 333.
	ActiveReportInterval time.Duration
	// WaitingHold is how long a node that starts waiting for a stage grant
	// waits before it reports so: a grant that comes meanwhile makes the
	// report Staging, one status write instead of two (amendment 18).
	// Default 2s.
	WaitingHold time.Duration
	// StageRetry is the first delay after a failed stage (doubling, at most
	// 10m). Default 30s.
	StageRetry time.Duration
	// CommandTimeout bounds bootc status and apply, and each D-Bus call.
	// Default 5m.
	CommandTimeout time.Duration
	// ReadyGrace bounds how long READY=1 waits for a fresh bootc status:
	// boot (multi-user.target) waits for the unit's start job. Default 20s.
	ReadyGrace time.Duration
	// Version is reported as status.agentVersion.
	Version string
}

func (c *Config) defaults() error {
	if c.NodeName == "" {
		return errors.New("node name is required")
	}
	c.defaultIntervals()
	return nil
}

// defaultIntervals sets every interval left zero to its production value.
func (c *Config) defaultIntervals() {
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	set(&c.PollInterval, time.Minute)
	set(&c.SettleTimeout, 2*time.Minute)
	set(&c.RebootTimeout, 15*time.Minute)
	set(&c.RereadInterval, 2*time.Second)
	set(&c.ReportInterval, 5*time.Minute)
	set(&c.ActiveReportInterval, time.Minute)
	set(&c.WaitingHold, 2*time.Second)
	set(&c.StageRetry, 30*time.Second)
	set(&c.CommandTimeout, 5*time.Minute)
	set(&c.ReadyGrace, 20*time.Second)
}

// Run runs the agent until ctx is cancelled; then it cancels any stage,
// sends STOPPING=1 and returns nil. It returns an error only when it cannot
// start.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if deps.Bootc == nil || deps.Host == nil {
		return errors.New("Deps.Bootc and Deps.Host are required")
	}
	if deps.Records == nil {
		if cfg.StateDir == "" {
			return errors.New("a state directory is required")
		}
		deps.Records = record.Store{Dir: cfg.StateDir}
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if deps.Notifier == nil {
		deps.Notifier = noNotifier{}
	}
	if deps.API == nil {
		if cfg.RESTConfig == nil {
			return errors.New("a REST config is required")
		}
		kube, err := newKube(cfg.RESTConfig, cfg.NodeName)
		if err != nil {
			return fmt.Errorf("connecting to the API server: %w", err)
		}
		deps.API = kube
	}
	return newRunner(cfg, deps).run(ctx)
}

type noNotifier struct{}

func (noNotifier) Ready() error                            { return nil }
func (noNotifier) Status(string) error                     { return nil }
func (noNotifier) Watchdog() error                         { return nil }
func (noNotifier) Stopping() error                         { return nil }
func (noNotifier) WatchdogInterval() (time.Duration, bool) { return 0, false }
