"""Load-test harness: synthetic workload shapes, drivers, reports and ``shoal loadtest``."""
