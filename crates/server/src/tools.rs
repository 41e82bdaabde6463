//! Tool calls in model output (stub).
