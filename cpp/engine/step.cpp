#include "engine/step.h"

#include "kv/encoder_session.h"
#include "ops/elementwise.h"

namespace mkv::engine {

StepRunner::StepRunner(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, uint32_t step_rows,
                       uint32_t logit_rows, uint32_t gemm_decode_rows)
    : device_(std::move(device)),
      model_(std::move(model)),
      queue_(device_->new_command_queue()),
      ws_(*device_, model_->spec(), step_rows, logit_rows),
      gemm_decode_rows_(gemm_decode_rows) {
  tokens_ = device_->new_buffer(size_t(logit_rows) * sizeof(int32_t));
  work_ = device_->new_buffer(size_t(logit_rows) * model_->spec().vocab * sizeof(float));
}

gpu::Counters StepRunner::run(const std::vector<model::Segment>& segments, const std::vector<int32_t>& ids,
                              const std::vector<Sampler>& samplers, std::vector<int32_t>& sampled,
                              const std::function<void()>& before_sampling) {
  const uint32_t vocab = model_->spec().vocab;
  if (!samplers.empty() && samplers.size() != model::Model::logit_rows(segments))
    ops::fail("engine", "a step samples every segment that wants its last row's logits, or none");
  ws_.write_ids(ids.data(), uint32_t(ids.size()));
  gpu::Counters counters;
  {
    kv::EncoderSession session(*queue_);  // the model commits every few layers (Model::encode_step)
    model_->encode_step(session, ws_, segments, gemm_decode_rows_);
    if (before_sampling) {
      session.flush();  // the forward pass runs while the host does the rest
      before_sampling();
    }
    gpu::ComputeEncoder& enc = session.compute();
    for (uint32_t r = 0; r < samplers.size(); ++r) {
      const Sampler& s = samplers[r];
      const ops::BufferView logits{ws_.logits().buffer, size_t(r) * vocab * sizeof(float)};
      const ops::BufferView token{tokens_, r * sizeof(int32_t)};
      if (s.params->greedy() && s.edits.n_bias == 0)  // (a constrained row: the argmax of its allowed ids)
        ops::argmax(*device_, enc, logits, token, 1, vocab, s.edits.mask);
      else
        ops::sample(*device_, enc, logits, s.penalty_ids, s.n_penalty, s.counted,
                    {work_, size_t(r) * vocab * sizeof(float)}, token, vocab, *s.params, s.uniform, s.draft,
                    s.edits);
    }
    counters = session.finish();
  }
  sampled.resize(samplers.size());
  if (!samplers.empty()) tokens_->read(0, sampled.data(), samplers.size() * sizeof(int32_t));
  return counters;
}

}  // namespace mkv::engine
