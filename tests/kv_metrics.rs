//! The worker's KV cache as an operator sees it: its size in the token-processor's `/health`
//! line and `specula_kv_cache_bytes`, and how its blocks are used (`specula_kv_cache_blocks` by
//! state, from the worker's heartbeats): after a request whose prompt fills whole blocks, those
//! blocks stay cached for the next one, and the three states always add up to the cache.

mod common;

use common::openai::{complete, completion_body};
use common::stack::{Stack, StackConfig};
use common::timing::PATIENCE;
use common::wait_until;

const BLOCKS: u32 = 256;
/// SmolLM2-135M in Q8_0: 30 layers × 3 KV heads × 2 (keys, values) × a 64-wide row in two
/// 34-byte blocks, × 16 tokens a block.
const BYTES_PER_BLOCK: u64 = 30 * 3 * 2 * 68 * 16;

/// The value of `name{...state="<state>"...}`, if exported.
fn blocks(text: &str, state: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with("specula_kv_cache_blocks{"))
        .find(|l| l.contains(&format!("state=\"{state}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kv_cache_size_and_block_use_are_reported() {
    let stack = Stack::start(StackConfig {
        worker_args: vec![
            "--num-kv-blocks".into(),
            BLOCKS.to_string(),
            "--kv-cache-dtype".into(),
            "q8_0".into(),
        ],
        ..StackConfig::default()
    })
    .await;
    // The worker's ready hello (which carries the size) reaches the token-processor's books
    // asynchronously to its health: wait for it, bounded.
    let want = Some((u64::from(BLOCKS) * BYTES_PER_BLOCK) as f64);
    wait_until(PATIENCE, "the KV cache's size exported", || async {
        gauge(&stack.metrics_text().await, "specula_kv_cache_bytes") == want
    })
    .await;
    let health = stack.tp_health_text().await;
    let expected = format!(
        "kv_capacity_tokens={} kv_bytes={}",
        BLOCKS * 16,
        u64::from(BLOCKS) * BYTES_PER_BLOCK
    );
    assert!(health.contains(&expected), "{expected:?} not in {health}");

    // A prompt of several whole blocks: once it has run, they are cached, held by nobody.
    let prompt =
        "Count slowly: one, two, three, four, five, six, seven, eight, nine, ten, eleven, \
                  twelve, thirteen, fourteen, fifteen, sixteen, seventeen, eighteen, nineteen.";
    let (status, body) = complete(
        stack.client(),
        &stack.api("/v1/completions"),
        &completion_body(prompt, 8, false),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    wait_until(PATIENCE, "the prompt's blocks reported cached", || async {
        let text = stack.metrics_text().await;
        matches!(
            (blocks(&text, "used"), blocks(&text, "cached"), blocks(&text, "free")),
            (Some(used), Some(cached), Some(free))
                if cached >= 2.0 && used == 0.0 && used + cached + free == f64::from(BLOCKS)
        )
    })
    .await;
}
