// Command bootc-fleet-coordinator is the cluster-side coordinator of bootc-fleet.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bootc-fleet-coordinator: not implemented yet")
	os.Exit(2)
}
