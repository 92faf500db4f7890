"""GPU sampling: NVML through one chokepoint, which devices to watch, and the sampler."""
