"""llama.cpp baseline for `benches/forward.rs`: the same GGUF, the same 64-token prompt, greedy
single-stream decode, timed the same way (wall clock and process CPU time per token).

    pip install llama-cpp-python numpy
    python3 engine-worker/benches/forward_llama_cpp.py models/SmolLM2-135M-Instruct.Q4_1.gguf

Env: THREADS (default 2), TOKENS decode steps (default 128).
"""

import os
import sys
import time

import numpy as np
from llama_cpp import Llama


def phase(what, tokens, wall0, cpu0):
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    print(
        f"{what}: {tokens} tokens in {wall * 1e3:.0f} ms = {tokens / wall:.1f} tokens/s "
        f"({wall * 1e3 / tokens:.2f} ms/token wall, {cpu * 1e3 / tokens:.2f} CPU-ms/token)"
    )


def main():
    path = sys.argv[1]
    threads = int(os.environ.get("THREADS", "2"))
    steps = int(os.environ.get("TOKENS", "128"))
    llm = Llama(
        model_path=path,
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=1024,
        n_batch=512,
        verbose=False,
    )
    print(f"llama.cpp (llama-cpp-python) | threads {threads}")
    prompt = [1 + (i * 7919) % 40_000 for i in range(64)]

    wall0, cpu0 = time.perf_counter(), time.process_time()
    llm.eval(prompt)
    phase("prefill, 64-token prompt", len(prompt), wall0, cpu0)

    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    start = llm.n_tokens
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    phase(f"decode, 1 stream (context {start}..{llm.n_tokens})", steps, wall0, cpu0)


if __name__ == "__main__":
    main()
