"""Alerts and export: threshold rules, their delivery, the thresholds file, and the Prometheus exporter."""
