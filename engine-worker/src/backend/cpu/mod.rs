//! CPU backend: f32 activations, quantized or f32 weights, multi-threaded.
