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
