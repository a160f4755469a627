// The learning rate of each step (train's --lr-schedule) against the formulas, and the schedules
// that cannot be followed refused with the option named.
#include <gtest/gtest.h>

#include <cmath>

#include "src/core/check.h"
#include "src/model/lr_schedule.h"

namespace llmhpc::test {
namespace {

LrSchedule schedule(LrDecay decay, int64_t warmup, int64_t decay_steps, double peak = 1e-3, double min = 1e-4) {
  LrSchedule s;
  s.decay = decay;
  s.peak = peak;
  s.min = min;
  s.warmup_steps = warmup;
  s.decay_steps = decay_steps;
  return s;
}

TEST(LrSchedule, WarmupRisesLinearlyFromZeroToThePeak) {
  for (LrDecay d : {LrDecay::Constant, LrDecay::Cosine, LrDecay::Linear}) {
    const LrSchedule s = schedule(d, 4, 10);
    EXPECT_DOUBLE_EQ(s.at(1), 0.25e-3) << lr_decay_name(d);
    EXPECT_DOUBLE_EQ(s.at(2), 0.5e-3) << lr_decay_name(d);
    EXPECT_DOUBLE_EQ(s.at(4), 1e-3) << lr_decay_name(d);
  }
}

TEST(LrSchedule, ConstantHoldsThePeak) {
  const LrSchedule s = schedule(LrDecay::Constant, 0, 0);
  for (int64_t step : {1, 2, 1000}) EXPECT_EQ(s.at(step), 1e-3);
}

TEST(LrSchedule, CosineAndLinearReachTheFloorAtTheDecayStep) {
  const LrSchedule cosine = schedule(LrDecay::Cosine, 2, 12), linear = schedule(LrDecay::Linear, 2, 12);
  // Halfway from the end of the warm-up (2) to the decay step (12): the mean of peak and floor.
  EXPECT_NEAR(cosine.at(7), 0.55e-3, 1e-15);
  EXPECT_NEAR(linear.at(7), 0.55e-3, 1e-15);
  // A quarter of the way: the cosine still near the peak, the line a quarter down.
  EXPECT_NEAR(cosine.at(4), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(M_PI * 0.2)), 1e-15);
  EXPECT_NEAR(linear.at(4), 1e-3 - 0.9e-3 * 0.2, 1e-15);
  for (int64_t step : {12, 13, 100}) {
    EXPECT_EQ(cosine.at(step), 1e-4);
    EXPECT_EQ(linear.at(step), 1e-4);
  }
  for (int64_t step = 3; step < 12; ++step) {  // strictly falling between
    EXPECT_LT(cosine.at(step), cosine.at(step - 1)) << step;
    EXPECT_LT(linear.at(step), linear.at(step - 1)) << step;
  }
}

TEST(LrSchedule, SchedulesThatCannotBeFollowedNameTheirOption) {
  auto refused = [](const LrSchedule& s) {
    try {
      s.validate();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refused(schedule(LrDecay::Cosine, 10, 10)).find("lr_decay_steps"), std::string::npos);
  EXPECT_NE(refused(schedule(LrDecay::Linear, 0, 10, 1e-3, 2e-3)).find("min_lr"), std::string::npos);
  EXPECT_NE(refused(schedule(LrDecay::Cosine, 0, 10, 1e-3, -1)).find("min_lr"), std::string::npos);
  EXPECT_NE(refused(schedule(LrDecay::Constant, -1, 0)).find("lr_warmup_steps"), std::string::npos);
  EXPECT_NE(refused(schedule(LrDecay::Constant, 0, 0, -1)).find("lr "), std::string::npos);
  EXPECT_EQ(refused(schedule(LrDecay::Constant, 5, 0)), "") << "warm-up then constant needs no decay step";
  EXPECT_EQ(refused(schedule(LrDecay::Cosine, 0, 1)), "");
}

TEST(LrSchedule, NamesParseBack) {
  for (LrDecay d : {LrDecay::Constant, LrDecay::Cosine, LrDecay::Linear})
    EXPECT_EQ(parse_lr_decay(lr_decay_name(d)), d);
  EXPECT_THROW(parse_lr_decay("step"), UsageError);
}

}  // namespace
}  // namespace llmhpc::test
