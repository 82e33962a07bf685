//! token-processor: see README.md for the process picture.
