//! api-server: see README.md for the process picture.
