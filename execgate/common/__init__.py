"""What every execgate process shares: configuration, paths and records."""
