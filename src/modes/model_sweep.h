// What the modes that time the model's steps over bench's sweep share (bench, profile; ModelCase
// also ddp and memory): the
// options (--phase --warmup --steps and the model options), the configurations (sizes x
// precisions x attentions x context lengths x batch sizes, in that order), their labels and
// record attributes, the per-step samples, and the model kept across the configurations that
// can share it (same shape, precision and attention: a 2.7B initialisation takes seconds).
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "src/model/adamw.h"
#include "src/model/train_step.h"
#include "src/modes/mode.h"

namespace llmhpc {

struct ModelCase {
  ModelConfig model;
  int64_t batch;
  Precision precision;
  AttentionKind attention;
  GradientDType grads = GradientDType::Master;  // --grad-dtype, the same for every case of a run

  // "small_T128_B4_fp32_naive" ("..._gradbf16" with bf16 gradients); a custom shape is
  // "d64_ff128_L2_H4_T16_B4_fp32_naive".
  std::string label() const;
  // Cases with the same key can share a model: shape, precision, attention and gradient dtype.
  std::string model_key() const;
};

// --phase, --warmup, --steps and --cuda-graph into the mode's own group `own`; the model and precision
// options (lists sweep) as a group of their own into `desc`.
void add_step_options(po::options_description& own);
void add_model_group(po::options_description& desc);
std::vector<ModelCase> model_cases(const po::variables_map& vm);

// The step and model options bench and profile share, parsed and checked.
struct StepOptions {
  Phase phase = Phase::TrainStep;
  int64_t warmup = 0, steps = 0;
  double heat_s = 0;        // --heat-s: bench's (profile has none: 0)
  bool cuda_graph = false;  // the device is checked when the run starts (use_cuda_graph)
  std::vector<ModelCase> cases;
  MemoryPlan memory = MemoryPlan::Fast;
  uint64_t seed = 0;
};
// Throws UsageError for bad --phase, --warmup, --heat-s, --steps, --cuda-graph or model options.
StepOptions parse_step_options(const po::variables_map& vm);

// Configurations the backend cannot run at all (an attention or a precision it lacks): an
// error on every rank before anything starts. Notes bf16 on the CPU when a case has it
// (note_cpu_bf16).
void check_cases_run(const ModeContext& ctx, const std::vector<ModelCase>& cases);
// The configuration's attributes, as bench records them (docs/hdf5-schema.md, /bench).
void add_case_attrs(Record& rec, const ModelCase& c, Phase phase, MemoryPlan memory, int64_t warmup, int64_t steps);

// Per-step times of a run of steps, recorded as <prefix>forward_ms ... <prefix>step_ms.
struct StepSamples {
  std::vector<double> forward, backward, optimizer, step;
  void add(const StepTimes& t);
  void record(Record& r, const std::string& prefix) const;
};

// The model (and optimizer) of the current run of cases with one key.
class LiveModel {
 public:
  // Frees the model unless cases[i] can share it: call before the configuration's
  // measurement, so the next one is built with the previous one gone.
  void release_unless_shared(const std::vector<ModelCase>& cases, size_t i);
  // The model for cases[i] on `ops`: built and initialised (`seed`) if there is none, sized for
  // the longest context among the following cases that will share it, with an AdamW when
  // `phase` is a train step (inside backward, range by range, under GradientStorage::PerRange);
  // its batch set to cases[i]'s random tokens and targets. Records the attention kernel variant
  // in `rec`. `split`: this rank's part of a tensor-parallel model (TensorParallelMesh::
  // model_config; the whole model by default), the same for every case that shares the model.
  TransformerLM& prepare(const std::vector<ModelCase>& cases, size_t i, Device& dev, Ops& ops, uint64_t seed,
                         MemoryPlan memory, GradientStorage gradients, Phase phase, Record& rec,
                         const TensorParallel& split = {});
  AdamW* optimizer() { return opt_.get(); }
  // Frees the model and optimizer (after a failed configuration: the next builds its own).
  void release() {
    opt_.reset();
    model_.reset();
    key_.clear();
  }

 private:
  std::string key_;
  std::unique_ptr<TransformerLM> model_;
  std::unique_ptr<AdamW> opt_;
};

}  // namespace llmhpc
