package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// InstallScript is the script the image build runs; the nodes get the agent
// through it too.
func InstallScript() string {
	return filepath.Join(envtest.RepoRoot(), "packaging", "image", "install.sh")
}

// InstalledRoot mounts an overlay of base at run/root (the base stays
// untouched), installs the agent into it with packaging/image/install.sh,
// and adds the e2e layer (e2eLayer). It is unmounted when the test ends.
func InstalledRoot(t *testing.T, base, run string, bins binaries) (string, error) {
	upper, work, root := filepath.Join(run, "root-upper"), filepath.Join(run, "root-work"), filepath.Join(run, "root")
	for _, d := range []string{upper, work, root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", base, upper, work)
	if err := syscall.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("mounting the node root overlay: %w", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(root, syscall.MNT_DETACH); err != nil {
			t.Logf("unmounting %s: %v", root, err)
		}
	})
	cmd := exec.Command(InstallScript(), "--agent", bins.Agent, "--units", filepath.Join(envtest.RepoRoot(), "units"), root)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("install.sh: %w\n%s", err, out)
	}
	return root, e2eLayer(root, bins.Bootc)
}

// e2eLayer adds what only the test nodes have, never the product:
//   - the test bootc as /usr/bin/bootc, over the node's bind-mounted state;
//   - /run/ostree-booted at every boot (tmpfiles.d), so the unit's
//     ConditionPathExists holds as on a bootc host;
//   - WatchdogSec shortened to WatchdogSec seconds (a drop-in), and
//     ProtectControlGroups=no, without which a service in a container sees
//     the host's boot ID instead of the container's (see the drop-in);
//   - a gate: the agent's start waits for e2e-gate.service, which waits for
//     gateFile, so the harness is subscribed to the unit's state changes
//     on the node's bus before the agent starts;
//   - for soft reboots (systemd 254+): the harness's bind mounts survive
//     them, as /var survives on a real host (a drop-in per mount unit), and
//     e2e-soft-reboot.service plays, while the soft reboot runs, what
//     systemd's switch into ostree's /run/nextroot would do: the test bootc
//     enters the staged deployment if `bootc upgrade --soft-reboot=auto`
//     prepared it (sim-soft-reboot), and the gate closes again.
func e2eLayer(root, testBootc string) error {
	files := []struct {
		path string
		mode os.FileMode
		data string
	}{
		{"/usr/libexec/test-bootc", 0o755, ""},
		{"/usr/bin/bootc", 0o755, "#!/bin/sh\nBOOTC_TEST_STATE=" + nodeBootcState + " exec /usr/libexec/test-bootc \"$@\"\n"},
		{"/usr/lib/tmpfiles.d/bootc-fleet-e2e.conf", 0o644, "f /run/ostree-booted 0644 root root -\n"},
		{"/etc/systemd/system/" + AgentUnit + ".d/50-e2e.conf", 0o644,
			"# e2e only: a short watchdog, and a start gated on the harness.\n[Service]\nWatchdogSec=" + strconv.Itoa(WatchdogSec) + "s\n" +
				"# In a systemd-nspawn container the per-container boot ID is a file\n" +
				"# mounted over /proc/sys/kernel/random/boot_id; the private mount\n" +
				"# namespace that ProtectControlGroups= builds drops that mount (systemd\n" +
				"# 252), so the agent would read the host kernel's boot ID. A real host\n" +
				"# has no such mount.\nProtectControlGroups=no\n" +
				"[Unit]\nWants=e2e-gate.service\nAfter=e2e-gate.service\n"},
		{"/etc/systemd/system/e2e-gate.service", 0o644,
			"[Unit]\nDescription=Wait for the e2e harness\n[Service]\nType=oneshot\nRemainAfterExit=yes\nTimeoutStartSec=120\nExecStart=/bin/sh -c 'while [ ! -e " + gateFile + " ]; do sleep 0.05; done'\n"},
		// Runs in the soft-reboot transaction once every unit with default
		// dependencies (the agent included) has stopped (After=
		// shutdown.target), before systemd re-executes into the new
		// userspace. Without the gate file, e2e-gate.service, started again
		// by the new userspace, holds the agent until the harness follows it.
		{"/etc/systemd/system/e2e-soft-reboot.service", 0o644,
			"[Unit]\nDescription=e2e: the soft reboot enters what the test bootc prepared\nDefaultDependencies=no\nAfter=shutdown.target\nBefore=systemd-soft-reboot.service\n" +
				// Its outcome goes to a file in the test bootc's state (the
				// journal is down in this window). No RequiresMountsFor= on
				// that state: the dependency makes the soft reboot lose the
				// bind mount in the next userspace (seen with systemd 257).
				"[Service]\nType=oneshot\nExecStart=/bin/rm -f " + gateFile + "\n" +
				"ExecStart=/bin/sh -c 'date -u +%%FT%%TZ >>" + simSoftRebootLog + "; /usr/bin/bootc sim-soft-reboot >>" + simSoftRebootLog + " 2>&1; echo \"exit $$?\" >>" + simSoftRebootLog + "'\n" +
				"[Install]\nWantedBy=soft-reboot.target\n"},
	}
	// A bind mount of the harness is unmounted by a soft reboot (mount units
	// conflict with umount.target by default); on a real host this state is
	// on /var, which a soft reboot keeps.
	for _, m := range []string{nodeAgentState, nodeBootcState, nodeKubeconfig, nodeAgentEnv} {
		files = append(files, struct {
			path string
			mode os.FileMode
			data string
		}{"/etc/systemd/system/" + mountUnit(m) + ".d/50-e2e-keep.conf", 0o644,
			"# e2e only: a bind mount of the harness survives soft reboots.\n[Unit]\nDefaultDependencies=no\n"})
	}
	for _, f := range files {
		p := filepath.Join(root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if f.path == "/usr/libexec/test-bootc" {
			data, err := os.ReadFile(testBootc)
			if err != nil {
				return err
			}
			f.data = string(data)
		}
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			return err
		}
	}
	wants := filepath.Join(root, "etc/systemd/system/soft-reboot.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return err
	}
	if err := os.Symlink("/etc/systemd/system/e2e-soft-reboot.service", filepath.Join(wants, "e2e-soft-reboot.service")); err != nil && !os.IsExist(err) {
		return err
	}
	// Mount points of the per-node binds.
	for _, d := range []string{nodeAgentState, nodeBootcState, filepath.Dir(nodeKubeconfig)} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	for _, f := range []string{nodeKubeconfig, nodeAgentEnv} {
		if _, err := os.Stat(filepath.Join(root, f)); os.IsNotExist(err) {
			if err := os.WriteFile(filepath.Join(root, f), nil, 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}

// mountUnit is the name of the mount unit of an absolute path, escaped as
// systemd-escape --path does.
func mountUnit(path string) string {
	p := strings.Trim(path, "/")
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			b.WriteByte('-')
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == ':', c == '_', c == '.' && i > 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "\\x%02x", c)
		}
	}
	return b.String() + ".mount"
}
