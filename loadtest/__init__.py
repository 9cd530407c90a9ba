"""Load-test harness: synthetic workload shapes, drivers and reports."""
