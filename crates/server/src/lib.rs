//! `minfer serve`: an OpenAI-compatible HTTP server over one engine, with continuous
//! batching and prefix caching.

pub mod metrics;
pub mod page;
pub mod tools;
