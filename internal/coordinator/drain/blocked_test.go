package drain

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestBlockedErrorMessage(t *testing.T) {
	cases := []struct {
		name string
		err  *BlockedError
		want string
	}{
		{
			name: "timed out behind a PodDisruptionBudget",
			err: &BlockedError{Node: "node-3", TimedOut: true, Timeout: 30 * time.Second,
				Pods: []string{"default/web-1"}, PDBs: []string{"default/web-pdb"},
				Details: []PodBlock{{Pod: "default/web-1", PDBs: []string{"default/web-pdb"}}},
				Err:     errors.New("global timeout reached: 30s")},
			want: "drain of node-3 timed out after 30s: pod default/web-1 blocked by PodDisruptionBudget default/web-pdb",
		},
		{
			name: "timed out waiting for a terminating pod and a pod without budget",
			err: &BlockedError{Node: "n", TimedOut: true, Timeout: time.Minute,
				Details: []PodBlock{{Pod: "a/x", Terminating: true}, {Pod: "a/y"}}},
			want: "drain of n timed out after 1m0s: pod a/x still terminating; pod a/y not evicted",
		},
		{
			name: "two budgets on one pod",
			err: &BlockedError{Node: "n", TimedOut: true, Timeout: time.Second,
				Details: []PodBlock{{Pod: "a/x", PDBs: []string{"a/p", "a/q"}}}},
			want: "drain of n timed out after 1s: pod a/x blocked by PodDisruptionBudgets a/p, a/q",
		},
		{
			name: "failure other than a timeout keeps its cause",
			err:  &BlockedError{Node: "n", Pods: []string{"a/x"}, Err: errors.New("boom")},
			want: "drain of n failed: pod a/x not evicted: boom",
		},
		{
			name: "long lists are cut",
			err: &BlockedError{Node: "n", TimedOut: true, Timeout: time.Second,
				Pods: []string{"a/1", "a/2", "a/3", "a/4", "a/5", "a/6", "a/7"}},
			want: "drain of n timed out after 1s: pod a/1 not evicted; pod a/2 not evicted; pod a/3 not evicted; pod a/4 not evicted; pod a/5 not evicted; and 2 more pods",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.err.Error(); got != c.want {
				t.Fatalf("Error() =\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

func TestBlockedErrorUnwraps(t *testing.T) {
	var err error = &BlockedError{Node: "n", Err: errors.Join(context.Canceled, errors.New("x"))}
	err = fmt.Errorf("reconcile: %w", err)
	var be *BlockedError
	if !errors.As(err, &be) || be.Node != "n" {
		t.Fatal("errors.As did not find the BlockedError")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatal("cancellation is not visible through the BlockedError")
	}
}
