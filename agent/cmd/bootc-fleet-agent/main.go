// Command bootc-fleet-agent is the node agent of bootc-fleet.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bootc-fleet-agent: not implemented yet")
	os.Exit(2)
}
