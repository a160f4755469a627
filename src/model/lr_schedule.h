// The learning rate of each optimizer step (train's --lr-schedule): a linear warm-up from 0,
// then the peak held, or decayed along a cosine or a line to a floor.
#pragma once
#include <cstdint>
#include <string>

namespace llmhpc {

enum class LrDecay { Constant, Cosine, Linear };
LrDecay parse_lr_decay(const std::string& text);  // constant | cosine | linear
const char* lr_decay_name(LrDecay d);

struct LrSchedule {
  LrDecay decay = LrDecay::Constant;
  double peak = 1e-3;        // --lr
  double min = 0;            // --min-lr: where cosine and linear decay end
  int64_t warmup_steps = 0;  // steps 1..W take peak * step / W
  int64_t decay_steps = 0;   // the step at which the decay reaches min; min after it

  // Throws UsageError naming the option where the schedule cannot be followed.
  void validate() const;
  // The rate of optimizer step `step` (counted from 1 over the whole training, checkpoints
  // included, so a resumed run goes on along the same curve).
  double at(int64_t step) const;
};

}  // namespace llmhpc
