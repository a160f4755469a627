#include "src/model/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>

#include "src/core/check.h"
#include "src/io/h5.h"

namespace llmhpc {
namespace {

const char* kConfigAttrs[] = {"vocab_size", "context_length", "d_model", "d_ff", "num_layers", "num_heads"};

std::string shape_str(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

// Every model tensor must be in `group` with its shape, and nothing else may be there.
void check_tensors(hid_t group, const std::string& where, const std::string& path, const ParameterLayout& layout) {
  std::set<std::string> expected;
  for (const ParamInfo& p : layout.params()) {
    expected.insert(p.name);
    if (!h5::exists(group, p.name))
      throw UsageError("checkpoint '" + path + "' does not fit the model: " + where + " has no '" + p.name + "'");
    std::vector<int64_t> dims = h5::dataset_dims(group, p.name);
    std::vector<int64_t> want(p.whole.dims.begin(), p.whole.dims.begin() + p.whole.ndim);  // files hold whole tensors
    if (dims != want)
      throw UsageError("checkpoint '" + path + "' does not fit the model: " + where + "/" + p.name + " is " +
                       shape_str(dims) + ", the model needs " + shape_str(want) +
                       " (check {model} or {d_model}/{d_ff}/{num_layers}/{vocab_size})");
  }
  for (const std::string& name : h5::list_children(group))
    if (!expected.count(name))
      throw UsageError("checkpoint '" + path + "' does not fit the model: it has '" + where + "/" + name +
                       "', which this model does not (check {num_layers})");
}

// This rank's part of parameter `p` (the whole tensor under one rank) from a file's whole tensor.
std::vector<float> read_part(hid_t group, const ParamInfo& p, const ParameterLayout& layout) {
  std::vector<float> whole = h5::read_floats(group, p.name);
  if (p.split == Split::Whole) return whole;
  std::vector<float> part(size_t(p.shape.numel()), 0.0f);  // the vocabulary's padding: zero
  for (const PartRun& run : layout.part_runs(p))
    std::copy_n(whole.begin() + run.whole, run.count, part.begin() + run.part);
  return part;
}

// A checkpoint that fits `layout` (check_checkpoint_fits), read tensor by tensor, so that no more
// than one whole tensor is on the host at a time: its parameters and, where the file has
// optimizer state, its step, m and v. A tensor-parallel part's layout reads its part of each.
class CheckpointReader {
 public:
  CheckpointReader(const std::string& path, const ParameterLayout& layout) : layout_(layout) {
    check_checkpoint_fits(path, layout);
    file_ = h5::open_file(path, h5::Mode::Read);
    params_ = h5::open_group(file_.id(), "params");
    if (!h5::exists(file_.id(), "optimizer/m")) return;
    const std::vector<int64_t> step = h5::read_ints(file_.id(), "optimizer/step");
    if (step.size() != 1 || step[0] < 0) throw UsageError("checkpoint '" + path + "': bad /optimizer/step");
    step_ = step[0];
    m_ = h5::open_group(file_.id(), "optimizer/m");
    v_ = h5::open_group(file_.id(), "optimizer/v");
  }
  bool has_state() const { return step_ >= 0; }
  int64_t step() const { return step_; }
  std::vector<float> params(const ParamInfo& p) const { return read_part(params_.id(), p, layout_); }
  std::vector<float> m(const ParamInfo& p) const { return read_part(m_.id(), p, layout_); }
  std::vector<float> v(const ParamInfo& p) const { return read_part(v_.id(), p, layout_); }

 private:
  const ParameterLayout& layout_;
  h5::Handle file_, params_, m_, v_;  // the file first: closed last
  int64_t step_ = -1;
};

}  // namespace

std::vector<float> to_host_floats(Device& dev, const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    dev.copy_to_host(out.data(), t.data, t.bytes());
    return out;
  }
  std::vector<unsigned char> raw(t.bytes());
  dev.copy_to_host(raw.data(), t.data, t.bytes());
  for (size_t i = 0; i < out.size(); ++i) out[i] = float(load_as_double(raw.data(), i, t.dtype));
  return out;
}

void from_host_floats(Device& dev, const Tensor& t, const float* values) {
  if (t.dtype == DType::F64) {
    std::vector<double> d(values, values + t.numel());
    dev.copy_to_device(t.data, d.data(), t.bytes());
  } else {
    LLMHPC_CHECK(t.dtype == DType::F32, "from_host_floats fills fp32 or fp64 tensors");
    dev.copy_to_device(t.data, values, t.bytes());
  }
}

OptimizerState host_state(const AdamW& opt) {
  OptimizerState s{opt.steps_taken(), opt.hyper(), opt.owned(), {}, {}, {}};
  if (opt.has_state() && opt.owned_elements() > 0) {
    s.m = to_host_floats(opt.model().device(), opt.m());
    s.v = to_host_floats(opt.model().device(), opt.v());
  } else {
    s.m.assign(size_t(opt.owned_elements()), 0.0f);
    s.v = s.m;
  }
  return s;
}

CheckpointInfo inspect_checkpoint(const std::string& path) {
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  if (!h5::exists(f.id(), "params")) throw UsageError("'" + path + "' is not a checkpoint: it has no /params group");
  CheckpointInfo info;
  bool all = true;
  for (const char* a : kConfigAttrs) all = all && h5::has_attr(f.id(), a);
  if (all) {
    ModelConfig c;
    c.vocab_size = h5::read_attr_int(f.id(), "vocab_size");
    c.context_length = h5::read_attr_int(f.id(), "context_length");
    c.d_model = h5::read_attr_int(f.id(), "d_model");
    c.d_ff = h5::read_attr_int(f.id(), "d_ff");
    c.num_layers = h5::read_attr_int(f.id(), "num_layers");
    c.num_heads = h5::read_attr_int(f.id(), "num_heads");
    if (h5::has_attr(f.id(), "rope_theta")) c.rope_theta = h5::read_attr_double(f.id(), "rope_theta");
    info.config = c;
  }
  info.has_optimizer = h5::exists(f.id(), "optimizer/m") && h5::exists(f.id(), "optimizer/v");
  if (h5::exists(f.id(), "optimizer")) {
    h5::Handle g = h5::open_group(f.id(), "optimizer");
    if (h5::has_attr(g.id(), "options")) info.options = h5::read_attr_string(g.id(), "options");
  }
  return info;
}

using ParamValues = std::function<std::vector<float>(const ParamInfo&)>;
static void write_checkpoint(const std::string& path, const ModelConfig& c, const ParamValues& values,
                             const OptimizerState* state);

// Written whole under a name of this process's own and renamed: a kill leaves the previous
// checkpoint, and two runs saving to one path leave the last one's whole.
static void save_whole(const std::string& path, const ModelConfig& config, const ParamValues& values,
                       const OptimizerState* state) {
  const int64_t total = ParameterLayout(config).total();
  LLMHPC_CHECK(!state || (state->owned == std::vector<FlatRange>{{0, total}} && int64_t(state->m.size()) == total &&
                          int64_t(state->v.size()) == total),
               "a checkpoint holds the whole model's optimizer state");
  h5::remove_stale_work_files(path);
  const std::string work = h5::work_name(path);
  const RemoveOnFatal unpublished(work);  // an HDF5 write that fails ends the job at once
  try {
    write_checkpoint(work, config, values, state);
    h5::replace_file(work, path);
  } catch (const WriteFailed& e) {
    std::remove(work.c_str());  // a disk that filled, say: no half-written file left beside the checkpoint
    namespace fs = std::filesystem;
    std::error_code ec, no_space;
    const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
    const fs::space_info space = fs::space(dir, no_space);
    // The tensors in fp32 (m and v beside them), and HDF5's own bytes, a few per cent.
    const double needed = double(total) * 4.0 * (state ? 3 : 1) * 1.02;
    auto mb = [](double bytes) {
      char text[32];
      std::snprintf(text, sizeof text, "%.1f MB", bytes / 1e6);
      return std::string(text);
    };
    const bool kept = fs::exists(path, ec);
    throw WriteFailed("{save} '" + path + "': " + system_reason(e.error_number) + " writing the checkpoint (" +
                          mb(needed) + " needed" +
                          (!no_space ? ", " + mb(double(space.available)) + " free there" : "") +
                          "): free space there or give {save} a path on another file system; " +
                          (kept ? "the checkpoint there before is unchanged" : "no checkpoint was written"),
                      path, e.error_number);
  } catch (...) {
    std::remove(work.c_str());
    throw;
  }
}

void save_checkpoint(const std::string& path, TransformerLM& model, const OptimizerState* state) {
  LLMHPC_CHECK(model.layout().tensor_split().size == 1, "a tensor-parallel part is saved with the group's other parts");
  model.wait_parameters();  // a sharded optimizer's last all-gathers
  save_whole(
      path, model.config(), [&](const ParamInfo& p) { return to_host_floats(model.device(), model.param(p.name)); },
      state);
}

void save_checkpoint(const std::string& path, const ModelConfig& config, const std::vector<float>& params,
                     const OptimizerState* state) {
  LLMHPC_CHECK(int64_t(params.size()) == ParameterLayout(config).total(), "a checkpoint of the whole model");
  save_whole(
      path, config,
      [&](const ParamInfo& p) {
        return std::vector<float>(params.begin() + p.offset, params.begin() + p.offset + p.shape.numel());
      },
      state);
}

HostCheckpoint read_checkpoint(const std::string& path, const ParameterLayout& layout) {
  const CheckpointReader file(path, layout);
  HostCheckpoint out;
  out.params.resize(size_t(layout.total()));
  if (file.has_state()) {
    OptimizerState s;
    s.step = file.step();
    s.owned = {{0, layout.total()}};
    s.m.resize(size_t(layout.total()));
    s.v.resize(size_t(layout.total()));
    out.state = std::move(s);
  }
  for (const ParamInfo& p : layout.params()) {
    const std::vector<float> t = file.params(p);
    std::copy(t.begin(), t.end(), out.params.begin() + p.offset);
    if (!out.state) continue;
    const std::vector<float> m = file.m(p), v = file.v(p);
    std::copy(m.begin(), m.end(), out.state->m.begin() + p.offset);
    std::copy(v.begin(), v.end(), out.state->v.begin() + p.offset);
  }
  return out;
}

static void write_checkpoint(const std::string& path, const ModelConfig& c, const ParamValues& values,
                             const OptimizerState* state) {
  const ParameterLayout layout(c);
  h5::Handle f = h5::open_file(path, h5::Mode::Create);
  h5::write_attr(f.id(), "format", std::string("llmhpc-checkpoint"));
  h5::write_attr(f.id(), "vocab_size", c.vocab_size);
  h5::write_attr(f.id(), "context_length", c.context_length);
  h5::write_attr(f.id(), "d_model", c.d_model);
  h5::write_attr(f.id(), "d_ff", c.d_ff);
  h5::write_attr(f.id(), "num_layers", c.num_layers);
  h5::write_attr(f.id(), "num_heads", c.num_heads);
  h5::write_attr(f.id(), "rope_theta", c.rope_theta);
  h5::Handle params = h5::require_group(f.id(), "params");
  h5::Handle m, v;
  if (state) {
    h5::Handle g = h5::require_group(f.id(), "optimizer");
    h5::write_dataset(g.id(), "step", {}, &state->step);
    h5::write_attr(g.id(), "lr", state->hyper.lr);
    h5::write_attr(g.id(), "beta1", state->hyper.beta1);
    h5::write_attr(g.id(), "beta2", state->hyper.beta2);
    h5::write_attr(g.id(), "eps", state->hyper.eps);
    h5::write_attr(g.id(), "weight_decay", state->hyper.weight_decay);
    if (!state->options.empty()) h5::write_attr(g.id(), "options", state->options);
    m = h5::require_group(g.id(), "m");
    v = h5::require_group(g.id(), "v");
  }
  for (const ParamInfo& p : layout.params()) {
    std::vector<int64_t> dims(p.shape.dims.begin(), p.shape.dims.begin() + p.shape.ndim);
    h5::write_dataset(params.id(), p.name, dims, values(p).data());
    if (state) {
      h5::write_dataset(m.id(), p.name, dims, state->m.data() + p.offset);
      h5::write_dataset(v.id(), p.name, dims, state->v.data() + p.offset);
    }
  }
  h5::flush(f);
}

void check_checkpoint_fits(const std::string& path, const ParameterLayout& layout) {
  const CheckpointInfo info = inspect_checkpoint(path);
  h5::Handle f = h5::open_file(path, h5::Mode::Read);
  check_tensors(h5::open_group(f.id(), "params").id(), "/params", path, layout);
  if (info.has_optimizer) {
    check_tensors(h5::open_group(f.id(), "optimizer/m").id(), "/optimizer/m", path, layout);
    check_tensors(h5::open_group(f.id(), "optimizer/v").id(), "/optimizer/v", path, layout);
    if (!h5::exists(f.id(), "optimizer/step")) throw UsageError("checkpoint '" + path + "': /optimizer has no step");
  }
}

void load_checkpoint(const std::string& path, TransformerLM& model, AdamW* opt) {
  const ParameterLayout& layout = model.layout();
  const CheckpointReader file(path, layout);
  model.wait_parameters();  // nothing still arriving may land on the loaded values
  const bool with_opt = opt && file.has_state();
  if (with_opt) {
    opt->set_steps_taken(file.step());
    opt->allocate_state();
  }
  Device& dev = model.device();
  for (const ParamInfo& p : layout.params()) {
    from_host_floats(dev, model.param(p.name), file.params(p).data());
    if (!with_opt) continue;
    // The pieces of this tensor the optimizer owns, from the whole tensor in the file.
    const FlatRange tensor{p.offset, p.offset + p.shape.numel()};
    const std::vector<PackedPiece> pieces = packed_pieces(opt->owned(), tensor);
    if (pieces.empty()) continue;
    const std::vector<float> m_all = file.m(p), v_all = file.v(p);
    for (const PackedPiece& piece : pieces) {
      const int64_t from = piece.flat.begin - p.offset, n = piece.flat.size();
      from_host_floats(dev, opt->m().slice(piece.packed_offset, {n}), m_all.data() + from);
      from_host_floats(dev, opt->v().slice(piece.packed_offset, {n}), v_all.data() + from);
    }
  }
  model.parameters_changed();
}

}  // namespace llmhpc
