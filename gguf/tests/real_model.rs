//! Opens the project's default model (fetched by `scripts/fetch-model.sh`).

use std::path::PathBuf;

use gguf::{GgmlType, GgufFile};

fn model_path() -> PathBuf {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        path.display()
    );
    path
}

#[test]
fn reads_smollm2_metadata_and_tensors() {
    let file = GgufFile::open(model_path()).unwrap();
    let m = file.metadata();
    assert!(file.version() >= 2);
    assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(m.get_u32("llama.embedding_length").unwrap(), 576);
    let tokens = m.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1], "<|im_start|>");
    assert_eq!(m.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert!(!m.get_str_array("tokenizer.ggml.merges").unwrap().is_empty());
    assert_eq!(
        m.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        tokens.len()
    );
    assert!(m
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("im_start"));

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(
        file.tensor_data("token_embd.weight").unwrap().len() as u64,
        embd.size_bytes.unwrap()
    );
    assert!(file.tensors().iter().any(|t| t.ggml_type == GgmlType::Q4_1));
    assert_eq!(file.data_offset() % file.alignment(), 0);
}
