package decide

// Transition is one edge of the Step's phases (State.Phase): By names the
// input that takes it (a decision of a round, or the result of the
// effect the phase waits for).
type Transition struct {
	From, To Phase
	By       string
}

// Transitions are every phase change Step makes. The history property test
// fails when Step takes an edge this list lacks (or, over enough
// histories, never takes one it has), and TestAgentDiagramIsTransitions
// keeps the diagram in docs/agent.md equal to it.
var Transitions = []Transition{
	{PhaseReady, PhaseReady, "Nothing / RereadLater"},
	{PhaseReady, PhaseConfirmingStage, "Stage"},
	{PhaseReady, PhaseClearing, "ClearRecord"},
	{PhaseReady, PhaseRecording, "ApplyAndReboot (first use of the grant)"},
	{PhaseReady, PhaseCheckingStaged, "ApplyAndReboot (recorded in this boot)"},

	{PhaseConfirmingStage, PhaseStartingStage, "confirmed"},
	{PhaseConfirmingStage, PhaseReady, "not confirmed"},
	{PhaseStartingStage, PhaseStaging, "started"},
	{PhaseStartingStage, PhaseReady, "failed to start"},
	{PhaseStaging, PhaseStaging, "Nothing"},
	{PhaseStaging, PhaseCancelling, "CancelStage"},
	{PhaseStaging, PhaseReady, "StageDone"},
	{PhaseCancelling, PhaseReady, "cancelled"},
	{PhaseClearing, PhaseReady, "cleared / failed"},
	{PhaseClearing, PhaseRebootRequested, "failed after a reboot request"},

	{PhaseRecording, PhaseCheckingStaged, "recorded (an update's reboot is not reported, amendment 37)"},
	{PhaseRecording, PhaseReady, "failed"},
	{PhaseCheckingStaged, PhaseConfirmingApply, "staged is the granted image"},
	{PhaseCheckingStaged, PhaseClearing, "staged is not (drop the record)"},
	{PhaseCheckingStaged, PhaseReady, "another image unlocked, or grant gone"},
	{PhaseConfirmingApply, PhaseUnlocking, "confirmed"},
	{PhaseConfirmingApply, PhaseReady, "not confirmed"},
	{PhaseUnlocking, PhaseCheckingUnlocked, "unlocked"},
	{PhaseUnlocking, PhaseReady, "failed"},
	{PhaseCheckingUnlocked, PhaseConfirmingReboot, "staged is the granted image"},
	{PhaseCheckingUnlocked, PhaseClearing, "staged is not (drop the record)"},
	{PhaseCheckingUnlocked, PhaseReady, "another image unlocked, or grant gone"},
	{PhaseConfirmingReboot, PhaseRebooting, "confirmed"},
	{PhaseConfirmingReboot, PhaseReady, "not confirmed"},
	{PhaseRebooting, PhaseRebootRequested, "requested"},
	{PhaseRebooting, PhaseReady, "failed"},
	{PhaseRebootRequested, PhaseRebootRequested, "Nothing (waiting for the host to go down)"},
	{PhaseRebootRequested, PhaseClearing, "ClearRecord (new boot)"},

	// The rollback (amendment 25).
	{PhaseReady, PhaseRecording, "Rollback (first use of the grant)"},
	{PhaseReady, PhaseReporting, "Rollback (recorded in this boot)"},
	{PhaseRecording, PhaseReporting, "recorded (rollback)"},
	{PhaseReporting, PhaseCheckingRollback, "reported (rollback)"},
	{PhaseCheckingRollback, PhaseConfirmingRollback, "rollback is the granted image"},
	{PhaseCheckingRollback, PhaseConfirmingReboot, "rollback already queued"},
	{PhaseCheckingRollback, PhaseClearing, "rollback is not (drop the record)"},
	{PhaseConfirmingRollback, PhaseRollingBack, "confirmed"},
	{PhaseConfirmingRollback, PhaseReady, "not confirmed"},
	{PhaseRollingBack, PhaseCheckingRolledBack, "rolled back"},
	{PhaseRollingBack, PhaseReady, "failed"},
	{PhaseCheckingRolledBack, PhaseConfirmingReboot, "rollback queued"},
	{PhaseCheckingRolledBack, PhaseClearing, "not queued, or not the granted image (drop the record)"},
	{PhaseCheckingRolledBack, PhaseReady, "another rollback queued, or grant gone"},
}
