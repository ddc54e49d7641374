// StepRunner: runs one model step over the segments of several sequences in
// one command buffer, then samples a token for every segment that asked for
// its last row's logits (each with its own sampling parameters, penalty ids,
// generated-id counts and draw), and waits: one CPU wait per step, whatever the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "gpu/device.h"
#include "model/model.h"
#include "ops/sample.h"

namespace mkv::engine {

// How one segment's next token is drawn (segments with Logits::last, in order).
struct Sampler {
  const ops::SamplingParams* params = nullptr;
  ops::BufferView penalty_ids;   // uint32 ids repetition penalty looks at (read only when it is on)
  uint32_t n_penalty = 0;
  ops::GeneratedCounts counted;  // (id, count) of the ids generated so far (read when presence/frequency is on)
  float uniform = 0.0f;          // the draw in [0, 1) (unused when greedy)
  ops::DraftDraw draft;          // speculative verification of a sampled row (none: an ordinary draw)
  ops::LogitEdits edits;         // constrained decoding: logit_bias and the allowed ids' mask
};

class StepRunner {
 public:
  // step_rows: rows (tokens) a step may feed, the scheduler's step_tokens
  // (not a call's max_tokens); logit_rows: rows of logits (and samplers) a step
  // may make; gemm_decode_rows: Model::encode_step's (0: batch-invariant steps).
  StepRunner(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, uint32_t step_rows,
             uint32_t logit_rows, uint32_t gemm_decode_rows = 0);

  uint32_t step_rows() const { return ws_.step_rows(); }
  uint32_t logit_rows() const { return ws_.logit_rows(); }
  gpu::CommandQueue& queue() { return *queue_; }

  // Encodes, commits and waits for one step: `ids` are the segments' tokens in
  // order; samplers, one per Logits::last segment (or none: then the logits
  // stay in the workspace for read_logits). sampled[i] is sampler i's token.
  // before_sampling runs once the forward pass is committed, while the device
  // runs it, before the samplers are encoded: constrained decoding's masks.
  // Each segment must have passed Model::check_segment (the scheduler's plan
  // checks each, so one that cannot be stored fails alone).
  gpu::Counters run(const std::vector<model::Segment>& segments, const std::vector<int32_t>& ids,
                    const std::vector<Sampler>& samplers, std::vector<int32_t>& sampled,
                    const std::function<void()>& before_sampling = {});
  void read_logits(float* dst, uint32_t rows, uint32_t first = 0) const { ws_.read_logits(dst, rows, first); }

 private:
  gpu::DevicePtr device_;
  std::shared_ptr<const model::Model> model_;
  gpu::CommandQueuePtr queue_;
  model::Workspace ws_;
  gpu::BufferPtr tokens_;  // (logit_rows) int32: the sampled ids
  gpu::BufferPtr work_;    // (logit_rows, vocab) float: each sampler's scratch
  uint32_t gemm_decode_rows_;
};

}  // namespace mkv::engine
