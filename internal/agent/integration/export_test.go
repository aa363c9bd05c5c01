package integration

import "github.com/bootc-fleet/bootc-fleet/tests/envtest"

// SharedEnv is the API server TestMain started, for the runner's tests in
// package integration_test.
func SharedEnv() *envtest.Env { return env }
