"""One module per incident drill, each defining its `SCENARIO` (a
`lockstep_dev.drills.scenario.Scenario`): the spec it overrides, what it prepares, the
fault it injects and the checks it judges, and the engines it runs on. The registry
(`lockstep_dev.drills.registry`) lists them."""
