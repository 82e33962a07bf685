#!/usr/bin/env python3
"""Python reference for the token-processor benchmark: the per-request acceptance accounting of
FastDeploy's `fastdeploy/output/token_processor.py` (TokenProcessor._process_batch_output with
speculative decoding on), re-implemented from reading it, run on the same synthetic step
batches `tp-bench --dump-dir` writes.

What is reproduced per batch row, in FastDeploy's order:
  - `_record_speculative_decoding_accept_num_per_request`: per-request step count and per-head
    counts (a row's accept_num = tokens it emitted; a step with accept_num tokens bumps heads
    0..accept_num-1), plus the global per-head counts;
  - a RequestOutput/CompletionOutput per row, `copy.copy` of the task's metrics, first-token /
    inter-token latency observations, generation-token counter, token-by-token append with the
    per-request token counter;
  - on finish: `_compute_speculative_status` (the per-request speculate_metrics: accepted /
    rejected tokens, accept ratio, average accept length, per-head ratios), completion metrics,
    and the per-request dictionaries popped (recycle);
  - after the batch: `_record_speculative_decoding_metrics` (global gauges/counters, per-head
    acceptance rates), then the batch's results handed on (here: kept in a list).
Metrics use prometheus_client, as FastDeploy does (a minimal stand-in if it is not installed).

Deliberately left out, which makes this reference *faster* than FastDeploy: the f-string log
lines FastDeploy formats even with logging off (e.g. `llm_logger.debug(f"... {result}")` per
row), tracing spans, the paddle tensor reads and the IPC hand-off of results.

Usage: fd_reference.py DUMP_DIR   (files rows{R}_k{K}.jsonl from `tp-bench --dump-dir`)
"""

import copy
import glob
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import List, Optional

try:
    from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram

    HAVE_PROM = True
except ImportError:  # pragma: no cover - stand-ins with the same operations
    HAVE_PROM = False

    class _Metric:
        def __init__(self, *args, **kwargs):
            self.value = 0.0
            self.samples = []

        def inc(self, amount=1):
            self.value += amount

        def set(self, value):
            self.value = value

        def observe(self, value):
            self.samples.append(value)

    PCounter = Gauge = Histogram = _Metric

    class CollectorRegistry:  # noqa: D101
        pass


PREEMPTED_TOKEN_ID = -9
FLAG_PREFILL = 1
FLAG_PREEMPTED = 2


class Metrics:
    """The FastDeploy main_process_metrics the token processor touches."""

    def __init__(self, num_spec_tokens):
        reg = CollectorRegistry()
        self.time_to_first_token = Histogram("ttft", "ttft", registry=reg, buckets=[0.001, 0.01, 0.1, 1, 10, 100])
        self.time_per_output_token = Histogram("tpot", "tpot", registry=reg, buckets=[0.001, 0.01, 0.1, 1, 10])
        self.request_queue_time = Histogram("queue", "queue", registry=reg)
        self.request_prefill_time = Histogram("prefill", "prefill", registry=reg)
        self.request_decode_time = Histogram("decode", "decode", registry=reg)
        self.request_inference_time = Histogram("inference", "inference", registry=reg)
        self.request_generation_tokens = Histogram("gen_tokens", "gen tokens", registry=reg)
        self.request_token_ratio = Histogram("token_ratio", "token ratio", registry=reg)
        self.generation_tokens_total = PCounter("generation_tokens", "gen", registry=reg)
        self.request_success_total = PCounter("request_success", "ok", registry=reg)
        self.spec_decode_draft_acceptance_rate = Gauge("draft_acceptance_rate", "rate", registry=reg)
        self.spec_decode_efficiency = Gauge("efficiency", "eff", registry=reg)
        self.spec_decode_num_accepted_tokens_total = Gauge("accepted_tokens", "acc", registry=reg)
        self.spec_decode_num_emitted_tokens_total = Gauge("emitted_tokens", "emitted", registry=reg)
        self.spec_decode_num_draft_tokens_total = PCounter("draft_tokens", "draft", registry=reg)
        self.spec_decode_draft_single_head_acceptance_rate = [
            Gauge(f"head_rate_{i}", "head", registry=reg) for i in range(num_spec_tokens)
        ]


@dataclass
class RequestMetrics:
    arrival_time: float = 0.0
    inference_start_time: float = 0.0
    preprocess_start_time: float = 0.0
    preprocess_end_time: float = 0.0
    first_token_time: Optional[float] = None
    engine_recv_first_token_time: Optional[float] = None
    engine_recv_latest_token_time: Optional[float] = None

    def record_recv_first_token(self):
        now = time.time()
        self.engine_recv_first_token_time = now
        self.engine_recv_latest_token_time = now

    def record_recv_token(self):
        self.engine_recv_latest_token_time = time.time()


@dataclass
class Task:
    request_id: str
    prompt_token_ids_len: int
    metrics: RequestMetrics
    eos_token_ids: List[int] = field(default_factory=lambda: [2])
    output_token_ids: List[int] = field(default_factory=list)
    last_token_time: Optional[float] = None


@dataclass
class CompletionOutput:
    index: int
    send_idx: int
    token_ids: List[int]
    draft_token_ids: List[int]


@dataclass
class RequestOutput:
    request_id: str
    outputs: CompletionOutput
    finished: bool
    metrics: RequestMetrics
    prompt_token_ids_len: int = 0
    speculate_metrics: Optional[dict] = None


class FdStyleTokenProcessor:
    def __init__(self, num_spec_tokens):
        self.k = num_spec_tokens
        self.max_draft_tokens = max(6, num_spec_tokens + 1)  # FastDeploy: MAX_DRAFT_TOKENS = 6
        self.metrics = Metrics(num_spec_tokens)
        self.tasks = {}
        self.tokens_counter = Counter()
        self.total_step = 0
        self.number_of_output_tokens = 0
        self.speculative_stats_step = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_emitted_tokens = 0
        self.max_num_emitted_tokens = 0
        self.accept_token_num_per_head = [0] * self.max_draft_tokens
        self.accept_token_num_per_head_per_request = {}
        self.total_step_per_request = {}
        self.finished = []
        self.delivered = []

    # -- per request -------------------------------------------------------------------------
    def _record_accept_num_per_request(self, req_id, accept_num):
        if req_id not in self.total_step_per_request:
            self.total_step_per_request[req_id] = 0
        if req_id not in self.accept_token_num_per_head_per_request:
            self.accept_token_num_per_head_per_request[req_id] = [0] * self.max_draft_tokens
        self.total_step_per_request[req_id] += 1
        for i in range(accept_num):
            self.accept_token_num_per_head_per_request[req_id][i] += 1
            self.accept_token_num_per_head[i] += 1

    def _compute_speculative_status(self, result):
        self.speculative_stats_step += 1
        req_id = result.request_id
        accept_num_list = self.accept_token_num_per_head_per_request[req_id]
        req_total_step = self.total_step_per_request[req_id]
        req_total_draft_tokens = req_total_step * (self.k + 1)
        req_accepted_tokens = sum(accept_num_list)
        req_rejected_tokens = req_total_draft_tokens - req_accepted_tokens
        req_accept_ratio = 1 - req_total_step / req_accepted_tokens
        req_avg_accept_length = req_accepted_tokens / req_total_step
        accept_ratio_per_head = []
        for i in range(1, len(accept_num_list)):
            if accept_num_list[i - 1] != 0:
                accept_ratio_per_head.append(accept_num_list[i] / accept_num_list[i - 1])
            else:
                accept_ratio_per_head.append(0)
        result.speculate_metrics = dict(
            accepted_tokens=req_accepted_tokens,
            rejected_tokens=req_rejected_tokens,
            accept_ratio=req_accept_ratio,
            average_accept_length=req_avg_accept_length,
            accepted_tokens_per_head=accept_num_list[: self.k + 1],
            accept_ratio_per_head=accept_ratio_per_head[: self.k],
        )
        self.accept_token_num_per_head_per_request.pop(req_id)
        self.total_step_per_request.pop(req_id)

    def _record_metrics(self, task, current_time, token_ids):
        if task.last_token_time is not None:
            self.metrics.time_per_output_token.observe(current_time - task.last_token_time)
        task.last_token_time = current_time
        self.metrics.generation_tokens_total.inc(len(token_ids))

    def _record_first_token_metrics(self, task, current_time):
        m = task.metrics
        self.metrics.time_to_first_token.observe(current_time - m.arrival_time)
        self.metrics.request_queue_time.observe(m.inference_start_time - m.preprocess_end_time)
        self.metrics.request_prefill_time.observe(current_time - m.inference_start_time)

    def _record_completion_metrics(self, task, current_time):
        m = task.metrics
        if m.engine_recv_first_token_time:
            self.metrics.request_decode_time.observe(current_time - m.engine_recv_first_token_time)
        self.metrics.request_success_total.inc()
        self.metrics.request_inference_time.observe(current_time - m.inference_start_time)
        self.metrics.request_generation_tokens.observe(self.tokens_counter[task.request_id])

    def _recycle_resources(self, task_id):
        self.tasks.pop(task_id, None)
        if task_id in self.tokens_counter:
            del self.tokens_counter[task_id]

    # -- per batch ---------------------------------------------------------------------------
    def _record_speculative_decoding_metrics(self, accept_num):
        real_accept_num = [x for x in accept_num if x > 0]
        self.num_accepted_tokens = sum(self.accept_token_num_per_head[1:])
        self.num_emitted_tokens = sum(self.accept_token_num_per_head)
        if self.num_emitted_tokens == 0:
            return
        m = self.metrics
        m.spec_decode_num_accepted_tokens_total.set(self.num_accepted_tokens)
        m.spec_decode_num_emitted_tokens_total.set(self.num_emitted_tokens)
        num_draft_tokens = len(real_accept_num) * self.k
        self.num_draft_tokens += num_draft_tokens
        self.max_num_emitted_tokens += len(real_accept_num) * (self.k + 1)
        m.spec_decode_draft_acceptance_rate.set(self.num_accepted_tokens / self.num_draft_tokens)
        m.spec_decode_efficiency.set(self.num_emitted_tokens / self.max_num_emitted_tokens)
        m.spec_decode_num_draft_tokens_total.inc(num_draft_tokens)
        single_head_acceptance_rate = 0
        for i in range(1, self.k + 1):
            if self.accept_token_num_per_head[i - 1] != 0:
                single_head_acceptance_rate = self.accept_token_num_per_head[i] / self.accept_token_num_per_head[i - 1]
            m.spec_decode_draft_single_head_acceptance_rate[i - 1].set(single_head_acceptance_rate)

    def process_batch(self, batch):
        ids = batch["ids"]
        offsets = batch["token_offsets"]
        tokens = batch["tokens"]
        flags = batch["flags"]
        finish = batch["finish"]
        now = time.time()
        for row, owner, prompt_tokens in batch["starts"]:
            rid = str(ids[row])
            self.tasks[rid] = Task(
                request_id=rid,
                prompt_token_ids_len=prompt_tokens,
                metrics=RequestMetrics(arrival_time=now, inference_start_time=now, preprocess_start_time=now, preprocess_end_time=now),
            )
        # accept_num as FastDeploy's worker writes it: tokens emitted per row (preempted: negative).
        accept_num = [
            PREEMPTED_TOKEN_ID if flags[i] & FLAG_PREEMPTED else offsets[i + 1] - offsets[i] for i in range(len(ids))
        ]
        batch_result = []
        for i in range(len(ids)):
            task = self.tasks.get(str(ids[i]))
            if task is None:
                continue
            task_id = task.request_id
            self._record_accept_num_per_request(task_id, accept_num[i])
            if accept_num[i] == PREEMPTED_TOKEN_ID:
                continue
            token_ids = tokens[offsets[i] : offsets[i] + accept_num[i]]
            if accept_num[i] == 0:
                continue
            self.total_step += 1
            current_time = time.time()
            if self.tokens_counter[task_id] == 0:
                task.metrics.record_recv_first_token()
                metrics = copy.copy(task.metrics)
                self._record_first_token_metrics(task, current_time)
            else:
                task.metrics.record_recv_token()
                metrics = copy.copy(task.metrics)
            self.number_of_output_tokens += len(token_ids)
            self._record_metrics(task, current_time, token_ids)
            result = RequestOutput(
                request_id=task_id,
                outputs=CompletionOutput(index=i, send_idx=self.tokens_counter[task_id], token_ids=[], draft_token_ids=[]),
                finished=False,
                metrics=metrics,
                prompt_token_ids_len=task.prompt_token_ids_len,
            )
            last = len(token_ids) - 1
            for batch_token_index in range(len(token_ids)):
                token_id = token_ids[batch_token_index]
                self.tokens_counter[task_id] += 1
                result.outputs.token_ids.append(token_id)
                task.output_token_ids.append(token_id)
                # The synthetic worker marks the end in `finish`; FastDeploy sees it as EOS.
                if finish[i] != 0 and batch_token_index == last:
                    result.finished = True
                    self._compute_speculative_status(result)
                    self._record_completion_metrics(task, current_time)
                    self._recycle_resources(task_id)
                    self.finished.append(result.speculate_metrics)
                    break
            batch_result.append(result)
        self._record_speculative_decoding_metrics(accept_num)
        self.delivered.append(batch_result)  # postprocess(): handed to the output queue
        if len(self.delivered) > 64:
            self.delivered.clear()
        if len(self.finished) > 4096:
            self.finished.clear()


def percentile(sorted_values, q):
    return sorted_values[round((len(sorted_values) - 1) * q)]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    files = sorted(glob.glob(os.path.join(sys.argv[1], "rows*_k*.jsonl")))
    if not files:
        sys.exit(f"no rows*_k*.jsonl in {sys.argv[1]}")
    print(f"# FastDeploy-style Python reference (prometheus_client: {HAVE_PROM}, Python {sys.version.split()[0]})")
    print("| rows | K | batches | batches/s | request-steps/s | p50 | p99 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for path in files:
        with open(path) as f:
            header = json.loads(f.readline())
            batches = [json.loads(line) for line in f]
        k, rows = header["num_spec_tokens"], header["rows"]
        proc = FdStyleTokenProcessor(k)
        times = []
        start = time.perf_counter()
        for batch in batches:
            t = time.perf_counter_ns()
            proc.process_batch(batch)
            times.append((time.perf_counter_ns() - t) / 1e3)
        elapsed = time.perf_counter() - start
        times.sort()
        results.append((k, rows, len(batches), elapsed, times))
    for k, rows, n, elapsed, times in sorted(results):
        print(
            f"| {rows} | {k} | {n} | {n / elapsed:.0f} | {n * rows / elapsed:.0f} | "
            f"{percentile(times, 0.5):.0f} µs | {percentile(times, 0.99):.0f} µs |"
        )


if __name__ == "__main__":
    main()
