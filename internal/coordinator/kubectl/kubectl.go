// Package kubectl is `kubectl bootc-fleet` (the binary kubectl-bootc_fleet):
// what an operator asks of a rollout, answered from the API server alone.
// The coordinator's per-node view (the BootcNode annotations rollout-state
// and rollout-reason) deliberately holds nothing that changes with the clock
// or a queue position; this package adds that live part from the slot
// Leases, in the coordinator's own queue order (plan.StageOrder,
// plan.RebootOrder). docs/kubectl.md describes the commands and the
// structure of -o json|yaml.
package kubectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Options are what the command needs from its surroundings.
type Options struct {
	Out, ErrOut io.Writer
	// Now is the clock durations and ages are computed against (nil:
	// time.Now); tests fix it so their output does not depend on when
	// they run.
	Now     func() time.Time
	Version string
	// Client, when set, is used instead of one built from the kubeconfig
	// flags (the demo calls the commands in-process). status --watch and
	// wait need it to be a client.WithWatch.
	Client client.Client
}

// MaxHoldReason bounds the hold reason (the annotation's value).
const MaxHoldReason = 256

// Output formats of -o.
const (
	FormatTable = ""
	FormatJSON  = "json"
	FormatYAML  = "yaml"
)

// NewCommand is the root command, kubectl-bootc_fleet.
func NewCommand(o Options) *cobra.Command {
	if o.Now == nil {
		o.Now = time.Now
	}
	c := &cli{o: o, flags: genericclioptions.NewConfigFlags(true)}
	// Every object is cluster-scoped but the slot Leases, whose namespace
	// is fixed: -n would mean nothing.
	c.flags.Namespace = nil
	root := &cobra.Command{
		Use:           "kubectl-bootc_fleet",
		Short:         "See and steer bootc-fleet rollouts: why a node waits, pause a pool, hold a node",
		Version:       o.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl bootc-fleet"},
	}
	root.SetVersionTemplate("kubectl-bootc_fleet {{.Version}}\n")
	root.SetOut(o.Out)
	root.SetErr(o.ErrOut)
	c.flags.AddFlags(root.PersistentFlags())
	root.AddCommand(c.statusCommand(), c.explainCommand(), c.pauseCommand(true), c.pauseCommand(false), c.holdCommand(), c.releaseCommand(), c.waitCommand())
	return root
}

// cli is what the subcommands share: their surroundings and the kubeconfig
// flags of the root command.
type cli struct {
	o     Options
	flags *genericclioptions.ConfigFlags
}

// fleet is a reader of the cluster the flags name (or Options.Client), now.
func (c *cli) fleet(_ context.Context) (*reader, error) {
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	return &reader{c: cl, now: c.o.Now().UTC()}, nil
}

// client is Options.Client, or one for the cluster the flags name (one
// that can watch, for status --watch and wait).
func (c *cli) client() (client.Client, error) {
	if c.o.Client != nil {
		return c.o.Client, nil
	}
	cfg, err := c.flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-bootc_fleet/" + c.o.Version
	cl, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	return cl, nil
}

func checkOutput(output string) error {
	switch output {
	case FormatTable, FormatJSON, FormatYAML:
		return nil
	}
	return fmt.Errorf("-o %q: want json or yaml (or nothing, for a table)", output)
}

func (c *cli) statusCommand() *cobra.Command {
	var output string
	var watch bool
	status := &cobra.Command{
		Use:   "status [POOL]",
		Short: "Pools with their progress, budget used and what blocks them; with POOL, its nodes and why each waits",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pool := ""
			if len(args) == 1 {
				pool = args[0]
				if err := validName("pool", pool); err != nil {
					return err
				}
			}
			if err := checkOutput(output); err != nil {
				return err
			}
			if watch {
				return c.watchStatus(cmd.Context(), pool, output)
			}
			r, err := c.fleet(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := r.status(cmd.Context(), pool)
			if err != nil {
				return err
			}
			return printReport(c.o.Out, output, rep, func(w io.Writer) { writeStatus(w, rep) })
		},
	}
	status.Flags().StringVarP(&output, "output", "o", "", "output format: json or yaml (default: a table)")
	status.Flags().BoolVarP(&watch, "watch", "w", false, "redraw as the pools move, until Ctrl-C; when stdout is not a terminal, print each change and end once every pool shown is up to date or halted")
	return status
}

func (c *cli) explainCommand() *cobra.Command {
	var output string
	explain := &cobra.Command{
		Use:   "explain NODE",
		Short: "A node's whole story: target, booted, staged, its slot, its place in the queue, what blocks it, the last Events",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validName("node", args[0]); err != nil {
				return err
			}
			if err := checkOutput(output); err != nil {
				return err
			}
			r, err := c.fleet(cmd.Context())
			if err != nil {
				return err
			}
			ex, err := r.explain(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printReport(c.o.Out, output, ex, func(w io.Writer) { writeExplanation(w, ex) })
		},
	}
	explain.Flags().StringVarP(&output, "output", "o", "", "output format: json or yaml (default: text)")
	return explain
}

func (c *cli) pauseCommand(pause bool) *cobra.Command {
	use, short := "resume POOL", "Let the pool's rollout grant slots again (spec.rollout.paused: false)"
	if pause {
		use, short = "pause POOL", "Stop new grants in the pool (spec.rollout.paused: true); work already granted finishes"
	}
	return &cobra.Command{
		Use: use, Short: short, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validName("pool", args[0]); err != nil {
				return err
			}
			r, err := c.fleet(cmd.Context())
			if err != nil {
				return err
			}
			msg, err := r.setPaused(cmd.Context(), args[0], pause)
			if err != nil {
				return err
			}
			fmt.Fprintln(c.o.Out, msg)
			return nil
		},
	}
}

func (c *cli) holdCommand() *cobra.Command {
	var reason string
	hold := &cobra.Command{
		Use:   "hold NODE",
		Short: "Hold a node out of rollouts (Node annotation " + holdAnnotation + "); what it holds finishes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validName("node", args[0]); err != nil {
				return err
			}
			if err := validReason(reason); err != nil {
				return err
			}
			r, err := c.fleet(cmd.Context())
			if err != nil {
				return err
			}
			// Without --reason, a held node keeps the reason it has.
			msg, err := r.setHold(cmd.Context(), args[0], &reason, !cmd.Flags().Changed("reason"))
			if err != nil {
				return err
			}
			fmt.Fprintln(c.o.Out, msg)
			return nil
		},
	}
	hold.Flags().StringVar(&reason, "reason", "", fmt.Sprintf("why the node is held, shown with it (printable, at most %d bytes)", MaxHoldReason))
	return hold
}

func (c *cli) releaseCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "release NODE",
		Short: "Remove a node's hold: it takes part in rollouts again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validName("node", args[0]); err != nil {
				return err
			}
			r, err := c.fleet(cmd.Context())
			if err != nil {
				return err
			}
			msg, err := r.setHold(cmd.Context(), args[0], nil, false)
			if err != nil {
				return err
			}
			fmt.Fprintln(c.o.Out, msg)
			return nil
		},
	}
}

func (c *cli) waitCommand() *cobra.Command {
	var want string
	var timeout time.Duration
	wait := &cobra.Command{
		Use:   "wait POOL",
		Short: "Wait until the pool is up to date on the target of its current spec.image (or, with --for Halted, halted); exit 1 if it halts or the timeout runs out",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validName("pool", args[0]); err != nil {
				return err
			}
			if want != ForUpToDate && want != ForHalted {
				return fmt.Errorf("--for %q: want %s or %s", want, ForUpToDate, ForHalted)
			}
			if timeout < 0 {
				return fmt.Errorf("--timeout %s: want a duration of 0 (no limit) or more", timeout)
			}
			return c.wait(cmd.Context(), args[0], want, timeout)
		},
	}
	wait.Flags().StringVar(&want, "for", ForUpToDate, "what to wait for: "+ForUpToDate+" or "+ForHalted)
	wait.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (e.g. 30m); 0: no limit")
	return wait
}

// Run runs the command line args (without the program name) and returns
// the exit code, printing an error as kubectl does.
func Run(ctx context.Context, o Options, args []string) int {
	cmd := NewCommand(o)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(o.ErrOut, "error:", err)
		return 1
	}
	return 0
}

// Scheme has the built-in kinds and fleet.bootc.dev/v1alpha1.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(fleetv1.AddToScheme(s))
	return s
}

const holdAnnotation = fleetv1.AnnotationHold

func validName(what, name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%q is not a valid %s name: %s", name, what, strings.Join(errs, "; "))
	}
	return nil
}

// validReason: the hold reason is shown in tables and conditions, so one
// line of printable text, bounded.
func validReason(s string) error {
	if len(s) > MaxHoldReason {
		return fmt.Errorf("--reason is %d bytes; at most %d", len(s), MaxHoldReason)
	}
	if !utf8.ValidString(s) {
		return errors.New("--reason is not valid UTF-8")
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("--reason contains the unprintable character %q; use one line of printable text", r)
		}
	}
	return nil
}

// apiError says what the API server refused, naming the verb and resource.
func apiError(err error, verb, resource string) error {
	switch {
	case err == nil:
		return nil
	case kerrors.IsForbidden(err):
		return fmt.Errorf("not allowed to %s %s (RBAC): %w", verb, resource, err)
	case kerrors.IsUnauthorized(err):
		return fmt.Errorf("the API server did not accept your credentials (%s %s): %w", verb, resource, err)
	case meta.IsNoMatchError(err) || isNoResource(err):
		return fmt.Errorf("%s %s: the cluster does not serve this resource; are the bootc-fleet CRDs installed? (%w)", verb, resource, err)
	}
	return fmt.Errorf("%s %s: %w", verb, resource, err)
}

func isNoResource(err error) bool {
	var s kerrors.APIStatus
	return errors.As(err, &s) && kerrors.IsNotFound(err) && s.Status().Details != nil && s.Status().Details.Name == ""
}
