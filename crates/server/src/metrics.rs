//! Server metrics, rendered in the Prometheus text format (stub; see the issue).
