//! The name a model is served under when the operator gives none, derived from its path the same
//! way by the api-server (shown over HTTP) and the engine-worker (hellos and metric labels).

use std::path::Path;

/// The model the api-server and the engine-worker (and its bench) load when given no `--model`:
/// where `scripts/fetch-model.sh` puts it, relative to the repository root.
pub const DEFAULT_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Whether a file-name segment is a quantization tag (`Q4_1`, `Q4_K_M`, `IQ3_XS`, `F16`,
/// `BF16`, `f32`, ...), which names the file, not the model.
fn is_quant_tag(segment: &str) -> bool {
    let upper = segment.to_ascii_uppercase();
    let rest = upper
        .strip_prefix("IQ")
        .or_else(|| upper.strip_prefix("BF"))
        .or_else(|| upper.strip_prefix('Q'))
        .or_else(|| upper.strip_prefix('F'));
    rest.is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

/// The file (or directory) name without the `.gguf` extension and quantization tag, e.g.
/// `SmolLM2-135M-Instruct.Q4_1.gguf` → `SmolLM2-135M-Instruct`; `model` for a path with no name.
pub fn served_model_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = file.strip_suffix(".gguf").unwrap_or(&file);
    let name = match stem.rsplit_once(['.', '-']) {
        Some((base, tag)) if !base.is_empty() && is_quant_tag(tag) => base,
        _ => stem,
    };
    if name.is_empty() {
        "model".to_owned()
    } else {
        name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_drop_extension_and_quant_tag() {
        let name = |p: &str| served_model_name(Path::new(p));
        assert_eq!(
            name("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            "SmolLM2-135M-Instruct"
        );
        assert_eq!(
            name("llama-3-8b-instruct-Q4_K_M.gguf"),
            "llama-3-8b-instruct"
        );
        assert_eq!(name("tiny.f16.gguf"), "tiny");
        assert_eq!(name("/models/Qwen2.5-0.5B"), "Qwen2.5-0.5B");
        assert_eq!(name("plain.gguf"), "plain");
        assert_eq!(name("/"), "model");
    }

    #[test]
    fn default_model_is_served_as_smollm2() {
        assert_eq!(
            served_model_name(Path::new(DEFAULT_MODEL_PATH)),
            "SmolLM2-135M-Instruct"
        );
    }
}
