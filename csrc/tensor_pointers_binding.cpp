// The CUDA graphs' per-call staleness test (clip_flash/graphs/staleness.py) in one call: whether any watched tensor's
// data pointer moved since the watch was made. The same comparison as Python's one Tensor.data_ptr call per tensor
// (296 for ViT-L-14's image tower: about 20 us on a warm core, more on one that idled), on the encoder's every call.
// The tensors are held, as the watch holds them: a .data swap or a conversion changes the storage under the same
// tensor object, which is what moves its pointer.
#include <ATen/core/Tensor.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <utility>
#include <vector>

namespace clip_flash {
namespace {

class TensorPointers {
 public:
  explicit TensorPointers(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
    pointers_.reserve(tensors_.size());
    for (const at::Tensor& tensor : tensors_) pointers_.push_back(address(tensor));
  }

  bool changed() const {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (address(tensors_[i]) != pointers_[i]) return true;
    }
    return false;
  }

  size_t size() const { return tensors_.size(); }

 private:
  static const void* address(const at::Tensor& tensor) {
    return tensor.has_storage() ? tensor.const_data_ptr() : nullptr;
  }

  std::vector<at::Tensor> tensors_;
  std::vector<const void*> pointers_;
};

}  // namespace

void register_tensor_pointers(pybind11::module& module) {
  namespace py = pybind11;
  py::class_<TensorPointers>(module, "TensorPointers",
                             "The data pointers of a list of tensors, kept with the tensors: changed() says whether "
                             "any moved since (a .data swap, a conversion, a move to another device).")
      .def(py::init<std::vector<at::Tensor>>(), py::arg("tensors"))
      .def("changed", &TensorPointers::changed, "Whether any tensor's data pointer differs from the one it had.")
      .def("__len__", &TensorPointers::size);
}

}  // namespace clip_flash
