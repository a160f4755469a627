// The mode table. One row per mode; the order is the order --help lists them in.
#include "src/modes/mode.h"

namespace llmhpc {

ModeSpec bench_mode();
ModeSpec profile_mode();
ModeSpec train_mode();
ModeSpec comm_mode();
ModeSpec attention_mode();
ModeSpec ddp_mode();
ModeSpec memory_mode();
ModeSpec precision_mode();

const std::vector<ModeSpec>& all_modes() {
  static const std::vector<ModeSpec> modes = {
      bench_mode(),     profile_mode(), train_mode(),  comm_mode(),
      attention_mode(), ddp_mode(),     memory_mode(), precision_mode(),
  };
  return modes;
}

const ModeSpec* find_mode(const std::string& name) {
  for (const ModeSpec& m : all_modes())
    if (m.name == name) return &m;
  return nullptr;
}

void collective_check(const Runtime& rt, const std::function<void()>& check) {
  std::string error;
  int code = 2;
  try {
    check();
  } catch (const UsageError& e) {
    error = e.what();
  } catch (const OutOfMemory& e) {  // building the model, say: exit 3, as a step that does not fit
    error = std::string("out of memory: ") + e.what();
    code = 3;
  }
  agree_or_exit(rt, error, code);
}

}  // namespace llmhpc
