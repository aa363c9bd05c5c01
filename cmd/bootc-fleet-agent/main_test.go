package main

import (
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(options) bool
		wantErr bool
	}{
		{"defaults", []string{"--node-name", "n1"}, nil, func(o options) bool {
			return o.kubeconfig == "" && o.kubeFrom == "--kubeconfig" && o.bootcPath == "bootc" &&
				o.bootIDFile == "/proc/sys/kernel/random/boot_id" && o.stateDir == "/var/lib/bootc-fleet" &&
				reflect.DeepEqual(o.watchPaths, []string{"/ostree/bootc", "/sysroot/state/deploy"}) && o.pollInterval == time.Minute
		}, false},
		{"state directory from systemd", []string{"--node-name", "n1"}, map[string]string{"STATE_DIRECTORY": "/var/lib/x"},
			func(o options) bool { return o.stateDir == "/var/lib/x" }, false},
		{"environment overrides", []string{}, map[string]string{"BOOTC_FLEET_NODE_NAME": "n2", "BOOTC_FLEET_POLL_INTERVAL": "5s", "BOOTC_FLEET_WATCH_PATH": "/a:/b"},
			func(o options) bool {
				return o.nodeName == "n2" && o.pollInterval == 5*time.Second && reflect.DeepEqual(o.watchPaths, []string{"/a", "/b"})
			}, false},
		{"command line beats environment", []string{"--node-name", "n3", "--watch-path", "/c"}, map[string]string{"BOOTC_FLEET_NODE_NAME": "n2", "BOOTC_FLEET_WATCH_PATH": "/a"},
			func(o options) bool { return o.nodeName == "n3" && reflect.DeepEqual(o.watchPaths, []string{"/c"}) }, false},
		{"kubeconfig from the environment", []string{"--node-name", "n1"}, map[string]string{"BOOTC_FLEET_KUBECONFIG": "/etc/kc"},
			func(o options) bool { return o.kubeconfig == "/etc/kc" && o.kubeFrom == "BOOTC_FLEET_KUBECONFIG" }, false},
		{"kubeconfig flag beats the environment", []string{"--node-name", "n1", "--kubeconfig", "/etc/kc2"}, map[string]string{"BOOTC_FLEET_KUBECONFIG": "/etc/kc"},
			func(o options) bool { return o.kubeconfig == "/etc/kc2" && o.kubeFrom == "--kubeconfig" }, false},
		{"invalid node name", []string{"--node-name", "Bad_Name"}, nil, nil, true},
		// Not the hostname: the credential's identity decides (start).
		{"no node name: left to the credential", nil, nil, func(o options) bool { return o.nodeName == "" }, false},
		{"invalid environment value", []string{"--node-name", "n1"}, map[string]string{"BOOTC_FLEET_POLL_INTERVAL": "soon"}, nil, true},
		{"poll interval too short", []string{"--node-name", "n1", "--poll-interval", "1ms"}, nil, nil, true},
		{"stray argument", []string{"--node-name", "n1", "extra"}, nil, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(tc.args, env(tc.env), io.Discard)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if tc.check != nil && !tc.check(o) {
				t.Fatalf("options = %+v", o)
			}
		})
	}
}

func TestRunMissingKubeconfig(t *testing.T) {
	var stderr strings.Builder
	getenv := func(string) string { return "" }
	code := run([]string{"--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig"}, getenv, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "--kubeconfig /nonexistent/kubeconfig does not exist") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}
