"""Training-side capture: what runs on the training thread and rnnmon's own threads during a fit."""
