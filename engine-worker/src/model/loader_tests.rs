//! Loader tests on tiny model files written on the fly: the same weights as a GGUF file
//! (q/k permuted for adjacent-pair RoPE, as llama.cpp's converter stores them) and as a
//! Hugging Face directory (half-split RoPE) must give the same logits; broken files must give
//! errors that name the problem.

use std::path::PathBuf;

use gguf::{Array, GgmlType, GgufWriter, Value};

use super::*;
use crate::backend::cpu::{CpuBackend, CpuBackendOptions};
use crate::backend::{Backend, LogitsFor, SeqForward};

fn temp_path(name: &str) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("specula-model-{}-{n}-{name}", std::process::id()))
}

/// A tiny f32 model in the Hugging Face layout (half-split RoPE).
fn hf_model() -> Model {
    let mut config = ModelConfig::tiny();
    config.rope_style = RopeStyle::HalfSplit;
    config.tie_word_embeddings = false;
    Model::dummy(config, WeightType::F32, 5).unwrap()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Rows of a q/k matrix reordered from half-split to adjacent-pair layout, per head.
fn permute_for_gguf(m: &WeightMatrix, heads: usize) -> Vec<f32> {
    let dense = m.to_f32();
    let head_dim = m.rows / heads;
    let mut out = vec![0.0; dense.len()];
    for h in 0..heads {
        for i in 0..head_dim / 2 {
            for j in 0..2 {
                let src = h * head_dim + j * head_dim / 2 + i;
                let dst = h * head_dim + 2 * i + j;
                out[dst * m.cols..(dst + 1) * m.cols]
                    .copy_from_slice(&dense[src * m.cols..(src + 1) * m.cols]);
            }
        }
    }
    out
}

fn llama_metadata(config: &ModelConfig, arch: &str) -> GgufWriter {
    let u = |v: usize| Value::U32(v as u32);
    GgufWriter::new()
        .metadata("general.architecture", Value::String(arch.into()))
        .metadata("llama.context_length", u(config.max_position_embeddings))
        .metadata("llama.embedding_length", u(config.hidden_size))
        .metadata("llama.feed_forward_length", u(config.intermediate_size))
        .metadata("llama.block_count", u(config.num_layers))
        .metadata("llama.attention.head_count", u(config.num_heads))
        .metadata("llama.attention.head_count_kv", u(config.num_kv_heads))
        .metadata("llama.rope.freq_base", Value::F32(config.rope_theta))
        .metadata(
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(config.rms_norm_eps),
        )
        .metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
        .metadata(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(
                (0..config.vocab_size).map(|i| format!("t{i}")).collect(),
            )),
        )
        .metadata("tokenizer.ggml.bos_token_id", Value::U32(1))
        .metadata("tokenizer.ggml.eos_token_id", Value::U32(2))
        .metadata("tokenizer.ggml.eot_token_id", Value::U32(3))
}

/// `model` as a GGUF image; `skip` leaves out one tensor, `retype` stores one tensor with a
/// foreign type code.
fn write_gguf(model: &Model, arch: &str, skip: Option<&str>, retype: Option<&str>) -> PathBuf {
    let c = &model.config;
    let w = &model.weights;
    let mut tensors: Vec<(String, Vec<u64>, Vec<f32>)> = Vec::new();
    let matrix = |name: String, m: &WeightMatrix, data: Vec<f32>| {
        (name, vec![m.cols as u64, m.rows as u64], data)
    };
    tensors.push(matrix(
        "token_embd.weight".into(),
        &w.embed,
        w.embed.to_f32(),
    ));
    tensors.push(matrix(
        "output.weight".into(),
        &w.lm_head,
        w.lm_head.to_f32(),
    ));
    for (i, l) in w.layers.iter().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        tensors.push(matrix(
            n("attn_q.weight"),
            &l.wq,
            permute_for_gguf(&l.wq, c.num_heads),
        ));
        tensors.push(matrix(
            n("attn_k.weight"),
            &l.wk,
            permute_for_gguf(&l.wk, c.num_kv_heads),
        ));
        tensors.push(matrix(n("attn_v.weight"), &l.wv, l.wv.to_f32()));
        tensors.push(matrix(n("attn_output.weight"), &l.wo, l.wo.to_f32()));
        tensors.push(matrix(n("ffn_gate.weight"), &l.w_gate, l.w_gate.to_f32()));
        tensors.push(matrix(n("ffn_up.weight"), &l.w_up, l.w_up.to_f32()));
        tensors.push(matrix(n("ffn_down.weight"), &l.w_down, l.w_down.to_f32()));
        tensors.push((
            n("attn_norm.weight"),
            vec![c.hidden_size as u64],
            l.attn_norm.clone(),
        ));
        tensors.push((
            n("ffn_norm.weight"),
            vec![c.hidden_size as u64],
            l.ffn_norm.clone(),
        ));
    }
    tensors.push((
        "output_norm.weight".into(),
        vec![c.hidden_size as u64],
        w.final_norm.clone(),
    ));

    let mut writer = llama_metadata(c, arch);
    for (name, dims, data) in tensors {
        if Some(name.as_str()) == skip {
            continue;
        }
        if Some(name.as_str()) == retype {
            // Q5_K: a real ggml type this engine does not run; 256-element blocks of 176 bytes.
            let elems: u64 = dims.iter().product();
            writer = writer.tensor(
                &name,
                &[256, elems / 256],
                GgmlType::Q5K,
                vec![0; (elems / 256 * 176) as usize],
            );
            continue;
        }
        writer = writer.tensor(&name, &dims, GgmlType::F32, f32_bytes(&data));
    }
    let path = temp_path("model.gguf");
    std::fs::write(&path, writer.build()).unwrap();
    path
}

fn write_hf_dir(model: &Model) -> PathBuf {
    let c = &model.config;
    let w = &model.weights;
    let dir = temp_path("hf");
    std::fs::create_dir_all(&dir).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let matrix =
        |name: String, m: &WeightMatrix| (name, vec![m.rows, m.cols], f32_bytes(&m.to_f32()));
    tensors.push(matrix("model.embed_tokens.weight".into(), &w.embed));
    tensors.push(matrix("lm_head.weight".into(), &w.lm_head));
    for (i, l) in w.layers.iter().enumerate() {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        tensors.push(matrix(n("self_attn.q_proj.weight"), &l.wq));
        tensors.push(matrix(n("self_attn.k_proj.weight"), &l.wk));
        tensors.push(matrix(n("self_attn.v_proj.weight"), &l.wv));
        tensors.push(matrix(n("self_attn.o_proj.weight"), &l.wo));
        tensors.push(matrix(n("mlp.gate_proj.weight"), &l.w_gate));
        tensors.push(matrix(n("mlp.up_proj.weight"), &l.w_up));
        tensors.push(matrix(n("mlp.down_proj.weight"), &l.w_down));
        tensors.push((
            n("input_layernorm.weight"),
            vec![c.hidden_size],
            f32_bytes(&l.attn_norm),
        ));
        tensors.push((
            n("post_attention_layernorm.weight"),
            vec![c.hidden_size],
            f32_bytes(&l.ffn_norm),
        ));
    }
    tensors.push((
        "model.norm.weight".into(),
        vec![c.hidden_size],
        f32_bytes(&w.final_norm),
    ));
    // Two shards, as large checkpoints come.
    let (first, second) = tensors.split_at(tensors.len() / 2);
    for (i, part) in [first, second].into_iter().enumerate() {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = part
            .iter()
            .map(|(n, shape, data)| {
                let view = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    shape.clone(),
                    data,
                )
                .unwrap();
                (n.clone(), view)
            })
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.join(format!("model-0000{i}.safetensors")), bytes).unwrap();
    }
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": [2, 3]
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

fn logits(model: Model, tokens: &[u32]) -> Vec<f32> {
    let mut b = CpuBackend::new(model, CpuBackendOptions::new(4)).unwrap();
    b.forward(&[SeqForward {
        tokens,
        start_pos: 0,
        block_table: &[0, 1, 2, 3],
        logits: LogitsFor::All,
    }])
    .unwrap()
}

#[test]
fn gguf_and_hugging_face_layouts_give_the_same_logits() {
    let model = hf_model();
    let gguf_path = write_gguf(&model, "llama", None, None);
    let hf_dir = write_hf_dir(&model);

    let from_gguf = Model::load(&gguf_path, LoadFormat::Auto, WeightType::F32, 0).unwrap();
    assert_eq!(from_gguf.config.rope_style, RopeStyle::Interleaved);
    assert_eq!(from_gguf.config.eos_token_ids, [2, 3]);
    assert_eq!(from_gguf.config.bos_token_id, Some(1));
    assert!(!from_gguf.config.tie_word_embeddings);
    assert_eq!(from_gguf.tokenizer.as_ref().unwrap().tokens[7], "t7");
    let from_hf = Model::load(&hf_dir, LoadFormat::Auto, WeightType::F32, 0).unwrap();
    assert_eq!(from_hf.config.rope_style, RopeStyle::HalfSplit);
    assert_eq!(from_hf.config.eos_token_ids, [2, 3]);

    let mut expected_config = model.config.clone();
    expected_config.name = from_hf.config.name.clone();
    expected_config.eos_token_ids = vec![2, 3];
    assert_eq!(from_hf.config, expected_config);
    let tokens = [1u32, 50, 7, 200, 3, 3, 90, 12, 44, 5];
    let a = logits(from_gguf, &tokens);
    let b = logits(from_hf, &tokens);
    let c = logits(model, &tokens);
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "GGUF vs HF: {worst}");
    let worst = b
        .iter()
        .zip(&c)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst == 0.0, "HF load changed the weights: {worst}");

    // A dummy model of the file's shape.
    let dummy = Model::load(&gguf_path, LoadFormat::Dummy, WeightType::Q8_0, 1).unwrap();
    assert_eq!(dummy.config.hidden_size, 64);
    assert_eq!(dummy.weights.layers[0].wq.dtype, WeightType::Q8_0);

    std::fs::remove_file(gguf_path).unwrap();
    std::fs::remove_dir_all(hf_dir).unwrap();
}

#[test]
fn unsupported_or_broken_files_are_named() {
    let model = hf_model();
    let check = |path: PathBuf, want: &dyn Fn(&EngineError) -> bool| {
        let err = Model::load(&path, LoadFormat::Gguf, WeightType::F32, 0).unwrap_err();
        assert!(want(&err), "unexpected error: {err}");
        std::fs::remove_file(path).unwrap();
        err.to_string()
    };
    let msg = check(
        write_gguf(&model, "gpt2", None, None),
        &|e| matches!(e, EngineError::UnsupportedArchitecture { architecture } if architecture == "gpt2"),
    );
    assert!(msg.contains("gpt2"));
    let msg = check(
        write_gguf(&model, "llama", Some("blk.1.ffn_down.weight"), None),
        &|e| matches!(e, EngineError::MissingTensor { name } if name == "blk.1.ffn_down.weight"),
    );
    assert!(msg.contains("blk.1.ffn_down.weight"));
    let msg = check(
        write_gguf(&model, "llama", None, Some("blk.0.attn_v.weight")),
        &|e| matches!(e, EngineError::UnsupportedTensorType { name, .. } if name == "blk.0.attn_v.weight"),
    );
    assert!(msg.contains("Q5K"), "{msg}");

    let garbage = temp_path("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a model").unwrap();
    check(garbage, &|e| matches!(e, EngineError::Gguf { .. }));

    let truncated = temp_path("truncated.gguf");
    let bytes = std::fs::read(write_gguf(&model, "llama", None, None)).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    check(truncated, &|e| matches!(e, EngineError::Gguf { .. }));

    let missing = temp_path("missing.gguf");
    let err = Model::load(&missing, LoadFormat::Auto, WeightType::F32, 0).unwrap_err();
    assert!(matches!(err, EngineError::ModelIo { .. }), "{err}");

    let empty_dir = temp_path("empty-hf");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let err = Model::load(&empty_dir, LoadFormat::Auto, WeightType::F32, 0).unwrap_err();
    assert!(matches!(err, EngineError::ModelIo { .. }), "{err}");
    std::fs::remove_dir_all(empty_dir).unwrap();
}
