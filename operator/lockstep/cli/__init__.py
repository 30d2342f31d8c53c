"""The command lines: `lockstep` (`main`) and `kubectl lockstep` (`kubectl`)."""
