"""GPU placement policies: FGD's baselines, fragmentation gradient descent and shoal's own."""
