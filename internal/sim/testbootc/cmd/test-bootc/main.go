// Command test-bootc is a stand-in for bootc on test hosts: bootc's status,
// switch --download-only and upgrade --from-downloaded over a state directory
// ($BOOTC_TEST_STATE), plus sim-reboot and friends for test harnesses.
package main

import (
	"os"

	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
)

func main() {
	os.Exit(testbootc.Main(os.Args[1:], os.Stdout, os.Stderr))
}
