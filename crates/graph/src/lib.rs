//! minfer-graph.
