// Command bootc-fleet-agent is the node agent of bootc-fleet: run by systemd
// on every bootc host, it stages and applies the image its BootcNode asks for,
// only under the grants the coordinator gives it (docs/agent.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/transport"

	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/host"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/kubeconfig"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// options are the command line, after environment overrides.
type options struct {
	kubeconfig   string
	kubeFrom     string // "--kubeconfig" or "BOOTC_FLEET_KUBECONFIG": where kubeconfig came from
	nodeName     string
	bootcPath    string
	bootIDFile   string
	stateDir     string
	watchPaths   []string
	pollInterval time.Duration
	settle       time.Duration
	rebootTO     time.Duration
	logLevel     string
	traceFile    string
	showVersion  bool
}

type listFlag struct{ vals *[]string }

func (l listFlag) String() string {
	if l.vals == nil {
		return ""
	}
	return strings.Join(*l.vals, ",")
}
func (l listFlag) Set(v string) error { *l.vals = append(*l.vals, v); return nil }

// parse reads flags; BOOTC_FLEET_<FLAG> (dashes as underscores) sets a flag's
// default, so the systemd unit's EnvironmentFile can configure the agent.
func parse(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	stateDir := "/var/lib/bootc-fleet"
	if d := getenv("STATE_DIRECTORY"); d != "" {
		stateDir = strings.Split(d, ":")[0]
	}
	o := options{}
	fs := flag.NewFlagSet("bootc-fleet-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig to reach the API server as this node (default: the kubelet's, see docs/agent.md)")
	fs.StringVar(&o.nodeName, "node-name", "", "this node's name (its Node and BootcNode; default: the identity of the kubeconfig's credential, system:node:<name>)")
	fs.StringVar(&o.bootcPath, "bootc", "bootc", "bootc executable")
	fs.StringVar(&o.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding the current boot ID")
	fs.StringVar(&o.stateDir, "state-dir", stateDir, "directory for the durable reboot record (default $STATE_DIRECTORY)")
	fs.Var(listFlag{&o.watchPaths}, "watch-path", "path whose changes trigger a status re-read (repeatable; default /ostree/bootc and /sysroot/state/deploy)")
	fs.DurationVar(&o.pollInterval, "poll-interval", time.Minute, "re-read everything at least this often")
	fs.DurationVar(&o.settle, "settle-timeout", 2*time.Minute, "how long after a reboot bootc status may still show the old image")
	fs.DurationVar(&o.rebootTO, "reboot-timeout", 15*time.Minute, "how long a recorded reboot may take")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.traceFile, "trace-file", "", "append each confirmed disruptive step and each stage end to this file as a JSON line (default: none)")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		env := "BOOTC_FLEET_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v := getenv(env)
		if v == "" {
			return
		}
		if f.Name == "watch-path" {
			o.watchPaths = append(o.watchPaths, strings.Split(v, ":")...)
			return
		}
		if err := f.Value.Set(v); err != nil && envErr == nil {
			envErr = fmt.Errorf("%s=%q: %w", env, v, err)
		}
	})
	if envErr != nil {
		return o, envErr
	}
	envWatch := o.watchPaths
	o.watchPaths = nil
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	o.kubeFrom = "--kubeconfig"
	if getenv("BOOTC_FLEET_KUBECONFIG") != "" {
		o.kubeFrom = "BOOTC_FLEET_KUBECONFIG"
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "kubeconfig" {
				o.kubeFrom = "--kubeconfig"
			}
		})
	}
	if o.watchPaths == nil {
		o.watchPaths = envWatch
	}
	if o.watchPaths == nil {
		o.watchPaths = []string{"/ostree/bootc", "/sysroot/state/deploy"}
	}
	if o.showVersion {
		return o, nil
	}
	if errs := validation.IsDNS1123Subdomain(o.nodeName); o.nodeName != "" && len(errs) > 0 {
		return o, fmt.Errorf("--node-name %q is not a valid node name: %s", o.nodeName, strings.Join(errs, "; "))
	}
	if o.pollInterval < time.Second {
		return o, fmt.Errorf("--poll-interval %s is below 1s", o.pollInterval)
	}
	return o, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := parse(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bootc-fleet-agent:", err)
		return 2
	}
	if o.showVersion {
		fmt.Fprintln(stdout, "bootc-fleet-agent", version)
		return 0
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintln(stderr, "bootc-fleet-agent: --log-level:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := start(ctx, o, log); err != nil {
		log.Error("bootc-fleet-agent failed", "err", err)
		return 1
	}
	return 0
}

// certReloadInterval is how often client-go re-reads the client certificate
// files of a kubeconfig (client-certificate/client-key as paths, as the
// kubelet's are) and, when they changed, closes its connections so the next
// TLS handshake presents the new certificate (k8s.io/client-go/transport,
// cert_rotation.go; every new handshake re-reads the files too). client-go's
// default is 5 minutes: a certificate renewed less than that before the old
// one expires would cost requests refused with 401 until then (or until the
// API server drops the connection after a 401). The kubelet rotates long
// before expiry, so this matters only for late renewals; reading two small
// files every 30 s costs nothing.
const certReloadInterval = 30 * time.Second

func start(ctx context.Context, o options, log *slog.Logger) error {
	kc, err := kubeconfig.Find(o.kubeconfig, o.kubeFrom, kubeconfig.Kubelet, kubeconfig.Load)
	if err != nil {
		return err
	}
	auth, reloads := kubeconfig.Describe(kc.Config)
	log.Info("using kubeconfig", "path", kc.Path, "from", kc.Source, "server", kc.Config.Host, "auth", auth)
	for _, s := range kc.Skipped {
		log.Info("kubeconfig candidate skipped", "candidate", s)
	}
	if !reloads {
		log.Warn("the kubeconfig's credential is read once: restart the agent when it is renewed", "path", kc.Path)
	}
	// Set before the agent creates its clients: the rotation loop reads it
	// when the first transport is built. The config keeps file references
	// (kubeconfig.Load), so client-go reloads them; nothing here may copy
	// certificate data into it (that would pin the first certificate) or
	// set a custom Transport (which disables client-go's TLS handling).
	transport.CertCallbackRefreshDuration = certReloadInterval
	rc := kc.Config
	rc.UserAgent = "bootc-fleet-agent/" + version
	node, err := nodeName(ctx, o.nodeName, kc, log)
	if err != nil {
		return err
	}
	sd, err := host.DialSystemd(ctx)
	if err != nil {
		return fmt.Errorf("connecting to systemd over D-Bus: %w", err)
	}
	defer sd.Close()
	changes, err := host.Watch(ctx, o.watchPaths, o.pollInterval)
	if err != nil {
		return fmt.Errorf("watching %v: %w", o.watchPaths, err)
	}
	cfg := agent.Config{
		NodeName:      node,
		RESTConfig:    rc,
		StateDir:      o.stateDir,
		PollInterval:  o.pollInterval,
		SettleTimeout: o.settle,
		RebootTimeout: o.rebootTO,
		Version:       version,
	}
	deps := agent.Deps{
		Bootc:    &bootc.CLI{Path: o.bootcPath},
		Host:     machine{bootIDFile: o.bootIDFile, Systemd: sd},
		Notifier: host.NewNotifier(),
		Log:      log,
		Changes:  changes,
	}
	if o.traceFile != "" {
		f, err := os.OpenFile(o.traceFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("--trace-file: %w", err)
		}
		defer f.Close()
		deps.Trace = agent.NewTraceWriter(f, log)
	}
	return agent.Run(ctx, cfg, deps)
}

// nodeName is --node-name, or else the identity of the kubeconfig's
// credential: the client certificate's common name (the kubelet's is
// system:node:<name>), or, for a credential without one, what the API
// server says it is (SelfSubjectReview). A --node-name that differs from a
// node credential's identity is refused here, at startup, rather than by
// the API server on every write.
func nodeName(ctx context.Context, given string, kc kubeconfig.Choice, log *slog.Logger) (string, error) {
	user, err := kubeconfig.CertificateUser(kc.Config)
	from := "the client certificate of " + kc.Path
	if err != nil {
		return "", fmt.Errorf("%s: %w", kc.Path, err)
	}
	if user == "" {
		from = "the API server's SelfSubjectReview of " + kc.Path
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		user, err = kubeconfig.ServerUser(rctx, kc.Config)
		cancel()
		if err != nil && given == "" {
			return "", fmt.Errorf("cannot tell this node's name from %s (%w); pass --node-name", kc.Path, err)
		}
		if err != nil {
			log.Warn("cannot check --node-name against the credential's identity", "err", err)
		}
	}
	node, err := kubeconfig.NodeName(given, user, from)
	if err != nil {
		return "", err
	}
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return "", fmt.Errorf("node name %q (from %s) is not a valid node name: %s", node, from, strings.Join(errs, "; "))
	}
	log.Info("node name", "node", node, "given", given != "", "credential", user)
	return node, nil
}

// machine joins the boot ID file and systemd into agent.Host.
type machine struct {
	bootIDFile string
	*host.Systemd
}

func (m machine) BootID() (string, error) { return host.ReadBootID(m.bootIDFile) }
