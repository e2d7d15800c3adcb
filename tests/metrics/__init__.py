"""The chart's Grafana dashboards against a real Prometheus scraping the real services."""
