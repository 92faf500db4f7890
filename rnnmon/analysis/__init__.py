"""Analysis and findings: a run's record turned into numbers, gaps, a verdict and findings."""
