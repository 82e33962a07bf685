// Verification of drafted tokens on the device. A sequence verifying drafts d_1..d_n owns n + 1
// consecutive logit rows starting at row_offset (row i scores the token after d_i, d_0 being the
// last accepted token). Results per sequence: out_accepted = number of drafts accepted, and
// out_tokens[seq * (max_drafts + 1) ..] = the accepted drafts followed by one token chosen by the
// target model (correction or bonus), i.e. out_accepted + 1 tokens. One thread per sequence.

// Greedy: accept while the draft equals the target's argmax (Leviathan et al. 2023, greedy case).
extern "C" __global__ void greedy_accept(
    const u32* __restrict__ argmax,      // [rows]
    const u32* __restrict__ drafts,      // [seqs, max_drafts]
    const int* __restrict__ num_drafts,  // [seqs]
    const int* __restrict__ row_offset,  // [seqs]
    u32* __restrict__ out_tokens,        // [seqs, max_drafts + 1]
    int* __restrict__ out_accepted,      // [seqs]
    int seqs,
    int max_drafts) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= seqs) return;
    const u32* d = drafts + (size_t)s * max_drafts;
    const u32* g = argmax + row_offset[s];
    u32* o = out_tokens + (size_t)s * (max_drafts + 1);
    int accepted = 0;
    while (accepted < num_drafts[s] && d[accepted] == g[accepted]) {
        o[accepted] = d[accepted];
        ++accepted;
    }
    o[accepted] = g[accepted];
    out_accepted[s] = accepted;
}

// Sampling with a deterministic (one-hot) draft such as an n-gram proposer: draft d_i is
// accepted with probability p_i(d_i) (speculative sampling, Leviathan et al. 2023 / Chen et al.
// 2023, with q = one-hot). On the first rejection the replacement is drawn from p with d_i
// removed; when all are accepted the bonus token is drawn from the last row. This kernel makes
// the accept/reject decisions and names, per sequence, the row to sample (final_row) and the
// token to exclude (final_excluded, -1 for none); `sample_rows` then draws it and
// `finish_sampled` appends it.
extern "C" __global__ void sampled_accept(
    const float* __restrict__ logits,       // [rows, vocab]
    const float* __restrict__ stats,        // [rows, 2] from softmax_stats
    const float* __restrict__ temperature,  // [rows]
    const u32* __restrict__ drafts,         // [seqs, max_drafts]
    const int* __restrict__ num_drafts,     // [seqs]
    const int* __restrict__ row_offset,     // [seqs]
    const float* __restrict__ uniform,      // [seqs, max_drafts] acceptance draws
    u32* __restrict__ out_tokens,           // [seqs, max_drafts + 1]
    int* __restrict__ out_accepted,         // [seqs]
    u32* __restrict__ final_row,            // [seqs]
    int* __restrict__ final_excluded,       // [seqs]
    int seqs,
    int max_drafts,
    int vocab) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= seqs) return;
    const u32* d = drafts + (size_t)s * max_drafts;
    u32* o = out_tokens + (size_t)s * (max_drafts + 1);
    int accepted = 0;
    int excluded = -1;
    while (accepted < num_drafts[s]) {
        const int r = row_offset[s] + accepted;
        const float p = __expf((logits[(size_t)r * vocab + d[accepted]] - stats[2 * r]) /
                               temperature[r]) /
                        stats[2 * r + 1];
        if (uniform[(size_t)s * max_drafts + accepted] < p) {
            o[accepted] = d[accepted];
            ++accepted;
        } else {
            excluded = (int)d[accepted];
            break;
        }
    }
    out_accepted[s] = accepted;
    final_row[s] = (u32)(row_offset[s] + accepted);
    final_excluded[s] = excluded;
}

// Appends each sequence's sampled final token after its accepted drafts.
extern "C" __global__ void finish_sampled(
    const u32* __restrict__ sampled,     // [seqs]
    const int* __restrict__ accepted,    // [seqs]
    u32* __restrict__ out_tokens,        // [seqs, max_drafts + 1]
    int seqs,
    int max_drafts) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= seqs) return;
    out_tokens[(size_t)s * (max_drafts + 1) + accepted[s]] = sampled[s];
}
