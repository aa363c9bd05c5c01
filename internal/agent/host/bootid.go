// Package host connects the agent to the machine it runs on: the boot ID,
// systemd and logind over D-Bus, sd_notify, and file-change watches.
package host

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// DefaultBootIDPath is where the kernel publishes the current boot's ID.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// ErrInvalidBootID is wrapped when the boot-id file does not hold a boot ID.
var ErrInvalidBootID = errors.New("invalid boot ID")

// ReadBootID reads and validates the boot ID at path ("" = DefaultBootIDPath).
func ReadBootID(path string) (string, error) {
	if path == "" {
		path = DefaultBootIDPath
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading boot ID: %w", err)
	}
	if len(data) > 64 {
		return "", fmt.Errorf("%w in %s: %d bytes", ErrInvalidBootID, path, len(data))
	}
	id := strings.TrimSpace(string(data))
	if !lease.ValidBootID(id) {
		return "", fmt.Errorf("%w in %s: %q", ErrInvalidBootID, path, id)
	}
	return id, nil
}
