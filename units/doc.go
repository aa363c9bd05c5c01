// Package units holds the systemd units and presets bootc-fleet ships, and
// the tests that check them with systemd-analyze.
package units
