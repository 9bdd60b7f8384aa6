// fastgnn.torch's native backward node: an autograd Node in C++ whose
// backward replays a prepared kernel program (launch plans, see
// fastgnn/backends/cuda/plan.py) without entering Python.
//
// Why: on CUDA, autograd runs every node's backward on its device thread. A
// Python node there (an autograd.Function) costs far more host time than its
// body (docs/design.md, "Small graphs and autograd's device threads"); a C++
// node costs what its launches cost. The forward stays in Python (the plan
// path, on the calling thread); `attach` gives its outputs this node.
//
// A Program is built once per (graph, request, gradients wanted) in Python
// and shared by every node made from it:
//   table per call = [forward addresses given to attach...,
//                     cotangents (one per output)..., buffers allocated here...]
//   launches: CUfunction, grid, block, shared bytes, the parameter block's
//             fixed 8-byte slots, and (slot, table index, byte offset) for
//             each pointer written per call (0 stays 0: an absent buffer)
//   buffers:  shape and dtype, allocated uninitialised on the first cotangent's device
//   results:  per differentiable input, the buffer that is its gradient (-1: none)
// Launches go through the driver's cuLaunchKernel, whose address Python
// passes in (tests pass a recording fake), on the stream recorded at attach:
// autograd runs a node's backward on the stream its forward ran on.
#include <torch/extension.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// autograd's node pointer: std::shared_ptr<Node> up to torch 2.12,
// c10::intrusive_ptr<Node> after; both are served
using NodePtr = decltype(torch::autograd::Edge::function);
constexpr bool kSharedNodes = std::is_same_v<NodePtr, std::shared_ptr<Node>>;

template <class T, class... Args>
auto make_node(Args&&... args) {
  if constexpr (kSharedNodes && std::is_base_of_v<Node, T>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

template <class T>
NodePtr self_of(T* self) {
  if constexpr (kSharedNodes && std::is_base_of_v<Node, T>) {
    return self->shared_from_this();
  } else {
    return c10::intrusive_ptr<Node>::unsafe_reclaim_from_nonowning(self);
  }
}

// CUresult cuLaunchKernel(CUfunction, gx, gy, gz, bx, by, bz, shared bytes,
//                         CUstream, void** params, void** extra)
// byte alignment of every cotangent a program reads (a misaligned one is
// copied): the kernels' widest vector load, so programs may take any VEC
constexpr uint64_t kCotangentAlign = 16;

using LaunchFn = int (*)(uint64_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, uint64_t, void**, void**);

// A CUDA context current on the calling thread (the driver-API launch needs
// one): autograd's device threads may have none, since torch sets their
// device without touching the driver, so a node that runs before any runtime
// call on its thread binds the device's primary context (once per thread
// and device). The driver functions come from Python (`set_context_functions`);
// left unset (the tests' fake CUDA world), nothing is bound.
using CtxGetCurrentFn = int (*)(void**);
using CtxSetCurrentFn = int (*)(void*);
using DeviceGetFn = int (*)(int*, int);
using PrimaryCtxRetainFn = int (*)(void**, int);
CtxGetCurrentFn ctx_get_current = nullptr;
CtxSetCurrentFn ctx_set_current = nullptr;
DeviceGetFn device_get = nullptr;
PrimaryCtxRetainFn primary_ctx_retain = nullptr;

void ensure_context(int64_t device) {
  thread_local uint64_t bound = 0;   // devices < 64 seen with a context on this thread
  if (ctx_get_current == nullptr || device < 0 || device >= 64 || (bound >> device) & 1) {
    return;
  }
  void* ctx = nullptr;
  TORCH_CHECK(ctx_get_current(&ctx) == 0, "fastgnn: cuCtxGetCurrent failed");
  if (ctx == nullptr) {
    int dev = 0;
    TORCH_CHECK(device_get(&dev, static_cast<int>(device)) == 0 &&
                    primary_ctx_retain(&ctx, dev) == 0 && ctx_set_current(ctx) == 0,
                "fastgnn: could not make device ", device, "'s CUDA context current");
  }
  bound |= uint64_t{1} << device;
}

struct Launch {
  uint64_t func = 0;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned smem = 0;
  std::vector<uint64_t> values;                    // [params] the fixed slots
  std::vector<std::array<int64_t, 3>> dynamic;     // (slot, table index, offset)
};

struct Buffer {                                    // allocated uninitialised per backward
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

struct Program {
  std::string name;
  LaunchFn launch_fn = nullptr;
  int64_t num_addresses = 0;                       // forward addresses per call
  std::vector<std::vector<int64_t>> out_shapes;    // per output (cotangent shape)
  std::vector<Buffer> buffers;
  std::vector<Launch> launches;
  std::vector<int64_t> results;                    // per input: buffer index or -1
  py::object keep;                                 // what the fixed pointers point into

  ~Program() {
    // the last owner may be a node freed on autograd's device thread
    if (keep.ptr() != nullptr && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      keep = py::object();
    }
  }

  void add_launch(uint64_t func, std::vector<int64_t> grid, std::vector<int64_t> block,
                  int64_t smem, std::vector<uint64_t> values,
                  std::vector<std::array<int64_t, 3>> dynamic) {
    TORCH_CHECK(grid.size() == 3 && block.size() == 3, "grid and block take 3 entries");
    Launch l;
    l.func = func;
    for (int i = 0; i < 3; ++i) {
      l.grid[i] = static_cast<unsigned>(grid[i]);
      l.block[i] = static_cast<unsigned>(block[i]);
    }
    l.smem = static_cast<unsigned>(smem);
    l.values = std::move(values);
    for (const auto& d : dynamic) {
      TORCH_CHECK(d[0] >= 0 && d[0] < static_cast<int64_t>(l.values.size()),
                  "dynamic slot out of range");
    }
    l.dynamic = std::move(dynamic);
    launches.push_back(std::move(l));
  }

  void add_buffer(std::vector<int64_t> shape, int64_t dtype) {
    buffers.push_back({std::move(shape), static_cast<at::ScalarType>(dtype)});
  }
};

struct NativeBackward : public Node {
  std::shared_ptr<Program> program;
  std::vector<int64_t> addresses;     // [num_addresses] this call's forward addresses
  std::vector<SavedVariable> saved;   // inputs the backward reads (version-checked)
  std::vector<at::Tensor> held;       // forward buffers the addresses point into
  uint64_t stream = 0;
  at::TensorOptions cot_options;      // a cotangent's options (for absent ones)

  std::string name() const override { return "fastgnn::" + program->name + "Backward"; }

  bool released = false;

  void release_variables() override {
    saved.clear();
    held.clear();
    released = true;
  }

  variable_list apply(variable_list&& grads) override {
    const Program& p = *program;
    TORCH_CHECK(!released, "fastgnn: trying to backward through ", p.name, " a second time "
                "after its buffers were freed; pass retain_graph=True to the first backward");
    for (auto& s : saved) {
      s.unpack(self_of(this));   // raises if an input was modified in place
    }
    std::vector<at::Tensor> cot;
    cot.reserve(grads.size());
    std::vector<uint64_t> table(addresses.begin(), addresses.end());
    for (size_t k = 0; k < grads.size(); ++k) {
      at::Tensor g = grads[k];
      if (!g.defined()) {
        g = at::zeros(p.out_shapes[k], cot_options);
      } else {
        g = g.contiguous();
        if (reinterpret_cast<uint64_t>(g.data_ptr()) % kCotangentAlign) {
          g = g.clone();              // (the caching allocator's blocks are aligned)
        }
      }
      table.push_back(reinterpret_cast<uint64_t>(g.data_ptr()));
      cot.push_back(std::move(g));
    }
    const auto options = cot.empty() ? cot_options : cot[0].options();
    std::vector<at::Tensor> bufs;
    bufs.reserve(p.buffers.size());
    for (const auto& b : p.buffers) {
      at::Tensor t = at::empty(b.shape, options.dtype(b.dtype));
      table.push_back(t.numel() ? reinterpret_cast<uint64_t>(t.data_ptr()) : 0);
      bufs.push_back(std::move(t));
    }
    ensure_context(options.device().index());
    std::vector<uint64_t> values;
    std::vector<void*> params;
    for (const auto& l : p.launches) {
      values = l.values;
      for (const auto& d : l.dynamic) {
        const uint64_t base = table[d[1]];
        values[d[0]] = base ? base + static_cast<uint64_t>(d[2]) : 0;
      }
      params.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        params[i] = &values[i];
      }
      const int rc = p.launch_fn(l.func, l.grid[0], l.grid[1], l.grid[2], l.block[0],
                                 l.block[1], l.block[2], l.smem, stream, params.data(),
                                 nullptr);
      TORCH_CHECK(rc == 0, "fastgnn: ", p.name, " backward: cuLaunchKernel failed (CUresult ",
                  rc, ")");
    }
    variable_list out(p.results.size());
    for (size_t i = 0; i < p.results.size(); ++i) {
      if (p.results[i] >= 0 && task_should_compute_output(i)) {
        out[i] = bufs[p.results[i]];
      }
    }
    if (torch::autograd::GradMode::is_enabled()) {
      // once differentiable: differentiating these gradients again raises
      bool any = false;
      for (const auto& g : grads) {
        any = any || (g.defined() && g.requires_grad());
      }
      if (any) {
        NodePtr err = make_node<torch::autograd::Error>(
            "fastgnn: " + p.name + "'s backward is not differentiable (no double backward)",
            torch::autograd::collect_next_edges(grads));
        for (auto& o : out) {
          if (o.defined()) {
            torch::autograd::set_history(o, err);
          }
        }
      }
    }
    return out;
  }
};

// outputs: the forward's results (fresh tensors, no history); inputs: the
// op's differentiable inputs in order (None where absent); saved: inputs the
// backward reads; held: forward buffers it reads; addresses: this call's
// forward addresses (table entries 0..). Returns the outputs with the node.
std::vector<at::Tensor> attach(const std::shared_ptr<Program>& program,
                               std::vector<at::Tensor> outputs,
                               const std::vector<c10::optional<at::Tensor>>& inputs,
                               const std::vector<at::Tensor>& saved,
                               std::vector<at::Tensor> held, std::vector<int64_t> addresses,
                               uint64_t stream) {
  const Program& p = *program;
  TORCH_CHECK(static_cast<int64_t>(addresses.size()) == p.num_addresses, "fastgnn: ", p.name,
              ": ", addresses.size(), " addresses for a program of ", p.num_addresses);
  TORCH_CHECK(outputs.size() == p.out_shapes.size() && inputs.size() == p.results.size(),
              "fastgnn: ", p.name, ": outputs or inputs do not match the program");
  auto node = make_node<NativeBackward>();
  node->program = program;
  node->addresses = std::move(addresses);
  node->held = std::move(held);
  node->stream = stream;
  node->cot_options = outputs.empty() ? at::TensorOptions() : outputs[0].options();
  std::vector<at::Tensor> in;
  in.reserve(inputs.size());
  for (const auto& t : inputs) {
    in.push_back(t.has_value() ? *t : at::Tensor());
  }
  node->set_next_edges(torch::autograd::collect_next_edges(in));
  for (const auto& t : saved) {
    node->saved.emplace_back(t, false);
  }
  const NodePtr base = node;
  for (auto& o : outputs) {
    torch::autograd::set_history(o, base);
  }
  return outputs;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def(py::init([](std::string name, uint64_t launch_fn, int64_t num_addresses,
                       std::vector<std::vector<int64_t>> out_shapes,
                       std::vector<int64_t> results, py::object keep) {
             auto p = std::make_shared<Program>();
             p->name = std::move(name);
             p->launch_fn = reinterpret_cast<LaunchFn>(launch_fn);
             p->num_addresses = num_addresses;
             p->out_shapes = std::move(out_shapes);
             p->results = std::move(results);
             p->keep = std::move(keep);
             return p;
           }),
           py::arg("name"), py::arg("launch_fn"), py::arg("num_addresses"),
           py::arg("out_shapes"), py::arg("results"), py::arg("keep"))
      .def("add_launch", &Program::add_launch)
      .def("add_buffer", &Program::add_buffer)
      .def_property_readonly("num_buffers",
                             [](const Program& p) { return p.buffers.size(); })
      .def_property_readonly("num_launches",
                             [](const Program& p) { return p.launches.size(); });
  m.def(
      "set_context_functions",
      [](uint64_t get_current, uint64_t set_current, uint64_t get_device, uint64_t retain) {
        ctx_get_current = reinterpret_cast<CtxGetCurrentFn>(get_current);
        ctx_set_current = reinterpret_cast<CtxSetCurrentFn>(set_current);
        device_get = reinterpret_cast<DeviceGetFn>(get_device);
        primary_ctx_retain = reinterpret_cast<PrimaryCtxRetainFn>(retain);
      },
      py::arg("cu_ctx_get_current"), py::arg("cu_ctx_set_current"), py::arg("cu_device_get"),
      py::arg("cu_device_primary_ctx_retain"));
  m.def("attach", &attach, py::arg("program"), py::arg("outputs"), py::arg("inputs"),
        py::arg("saved"), py::arg("held"), py::arg("addresses"), py::arg("stream"));
}
