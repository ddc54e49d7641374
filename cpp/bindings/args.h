// Python arguments -> C++ values, for the bindings that take user input
// (Engine.generate, Engine.prefill, check_generate). Type checks live here: a
// value that is not an int, not a number, or too large for 64 bits is an
// ArgumentError naming the argument. Range checks live in C++
// (engine::check_generate_options, ops::validate_sampling), one owner each.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/media.h"

namespace mkv::bindings {

// An int (not a bool) that fits int64; np.integer counts.
int64_t int_arg(const char* op, const char* name, nanobind::handle v);
// A number (int or float, not a bool or a str); np.floating counts.
double number_arg(const char* op, const char* name, nanobind::handle v);

// GenerateOptions from the keyword arguments of generate/check_generate: types
// checked here; ranges are engine::check_generate_options's (Engine::submit runs it).
engine::GenerateOptions generate_options(nanobind::handle max_tokens, nanobind::handle temperature,
                                         nanobind::handle top_k, nanobind::handle top_p, nanobind::handle min_p,
                                         nanobind::handle repetition_penalty, nanobind::handle presence_penalty,
                                         nanobind::handle frequency_penalty, nanobind::handle seed,
                                         nanobind::handle logprobs, nanobind::handle speculate,
                                         nanobind::handle draft_tokens);

// logit_bias: None or a dict {int id: number}; types checked here, ids and
// ranges by Engine::submit (engine::check_logit_bias).
std::vector<std::pair<int32_t, float>> logit_bias_arg(nanobind::handle bias);

// constraint: None or a metalkv._core.Constraint (a Python subclass), held by
// the engine without touching Python when it lets go (constraint_bindings.cpp);
// release_pending() drops what it let go (the GIL held).
std::shared_ptr<engine::Constraint> constraint_arg(nanobind::handle h);
void release_pending();

// Token ids: a 1-D sequence of ints, each inside the vocabulary.
// check false (a prompt with media, whose ids Engine checks around the media's
// keys): only that each id fits int32.
std::vector<int32_t> token_ids_arg(nanobind::handle ids, uint32_t vocab, bool check = true);

// A prompt's media: None, or (spans [(start, length, bidirectional), ...], rows
// (n, hidden) float32 C-contiguous); engine::Media::check owns the rest.
std::shared_ptr<const engine::Media> media_arg(nanobind::handle media);

// Python's metalkv.ArgumentError (a ValueError with .argument, .value,
// .expected) for C++'s gpu::ArgumentError; registered by bind_gpu.
void register_argument_error(nanobind::module_& m);

}  // namespace mkv::bindings
