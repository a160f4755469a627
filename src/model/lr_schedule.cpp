#include "src/model/lr_schedule.h"

#include <cmath>

#include "src/core/check.h"
#include "src/core/table.h"
#include "src/core/units.h"

namespace llmhpc {

LrDecay parse_lr_decay(const std::string& text) {
  require_choice(text, {"constant", "cosine", "linear"}, "lr-schedule");
  return text == "cosine" ? LrDecay::Cosine : text == "linear" ? LrDecay::Linear : LrDecay::Constant;
}

const char* lr_decay_name(LrDecay d) {
  return d == LrDecay::Cosine ? "cosine" : d == LrDecay::Linear ? "linear" : "constant";
}

void LrSchedule::validate() const {
  if (!(peak >= 0)) throw UsageError("{lr} must not be negative");
  if (warmup_steps < 0) throw UsageError("{lr_warmup_steps} must not be negative");
  if (decay == LrDecay::Constant) return;
  if (!(min >= 0 && min <= peak))
    throw UsageError("{min_lr} must be between 0 and {lr} (got " + fmt_exact(min) + " with {lr} " + fmt_exact(peak) +
                     ")");
  if (decay_steps <= warmup_steps)
    throw UsageError("{lr_schedule} " + std::string(lr_decay_name(decay)) +
                     " decays from the end of the warm-up (step " + std::to_string(warmup_steps) +
                     ") to {lr_decay_steps}, which must come after it (got " + std::to_string(decay_steps) + ")");
}

double LrSchedule::at(int64_t step) const {
  if (step <= warmup_steps) return peak * double(step) / double(warmup_steps);
  if (decay == LrDecay::Constant) return peak;
  if (step >= decay_steps) return min;
  const double progress = double(step - warmup_steps) / double(decay_steps - warmup_steps);
  if (decay == LrDecay::Linear) return peak + (min - peak) * progress;
  return min + (peak - min) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace llmhpc
