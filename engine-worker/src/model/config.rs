/// Hyper-parameters of a Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2-style biases).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Short name for hellos and metric labels, e.g. "SmolLM2-135M-Instruct".
    pub name: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// q/k/v projections carry biases (Qwen2).
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// Every id that ends generation (EOS, EOT, ...).
    pub eos_token_ids: Vec<u32>,
}
