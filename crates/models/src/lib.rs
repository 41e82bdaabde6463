//! minfer-models.
