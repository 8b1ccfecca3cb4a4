// Python bindings of the batch decoder (image_batch_decoder.h): the inputs are taken from Python under the GIL,
// then the whole batch runs without it. Bad arguments (a bug of the caller, not a bad file) raise.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host_counter.h"
#include "image_batch_decoder.h"

namespace py = pybind11;

namespace clip_flash {
namespace {

at::Tensor long_rows(const std::vector<int64_t>& values, int64_t columns) {
  const int64_t rows = columns ? static_cast<int64_t>(values.size()) / columns : 0;
  at::Tensor out = at::empty({rows, columns}, at::TensorOptions().dtype(at::kLong));
  if (!values.empty()) std::memcpy(out.data_ptr<int64_t>(), values.data(), values.size() * sizeof(int64_t));
  return out;
}

void check_host_bytes(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte && t.dim() == 1 && t.is_contiguous(), name,
              " must be a contiguous 1-D CPU uint8 tensor");
}

const int64_t* offsets_of(const at::Tensor& t, size_t count, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous() &&
                  t.numel() == static_cast<int64_t>(count),
              name, " must be a contiguous 1-D CPU int64 tensor of one offset per item");
  return t.data_ptr<int64_t>();
}

// Keeps the Python objects whose bytes a scanned batch views, released under the GIL by whichever thread drops the
// batch last.
std::shared_ptr<void> hold(py::tuple objects) {
  return std::shared_ptr<void>(new py::object(std::move(objects)), [](void* held) {
    if (!Py_IsInitialized()) return;  // at exit: left to the process's end rather than a finished interpreter
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(held);
  });
}

}  // namespace

void register_image_batch_decoder(py::module& module) {
  py::class_<ScannedBatch, std::shared_ptr<ScannedBatch>>(
      module, "ScannedImageBatch", "A batch's inputs read and their headers scanned (ImageBatchDecoder.scan).")
      .def("__len__", [](const ScannedBatch& batch) { return batch.items.size(); })
      .def("info", [](const ScannedBatch& batch) { return long_rows(batch.info(), kInfoFields); },
           "int64 (n, 9): kind, height, width, channels, sampling, progressive, coefficient bytes, encoded bytes, "
           "format.")
      .def("layouts", [](const ScannedBatch& batch) { return long_rows(batch.layouts(), kLayoutFields); },
           "int64 (n, 24): each coefficient item's layout (see libjpeg_runtime.h), zero padded.")
      .def("views", [](const std::shared_ptr<ScannedBatch>& batch, const std::vector<int64_t>& positions) {
        py::list out;
        for (const int64_t position : positions) {
          TORCH_CHECK(position >= 0 && position < static_cast<int64_t>(batch->items.size()), "position ", position,
                      " is not in the batch");
          const std::string_view data = batch->items[position].data();
          TORCH_CHECK(!data.empty(), "item ", position, " has no bytes");
          // Read-only by contract (the bytes may be a Python bytes object): nothing writes an encoded image.
          out.append(at::from_blob(const_cast<char*>(data.data()), {static_cast<int64_t>(data.size())},
                                   [keep = batch](void*) mutable { keep.reset(); },
                                   at::TensorOptions().dtype(at::kByte)));
        }
        return out;
      }, "uint8 tensors viewing the encoded bytes of the items at `positions`, without copying them; each keeps the "
         "batch (and the bytes it views) alive. Never written to.", py::arg("positions"))
      .def("notes", [](const ScannedBatch& batch) {
        std::vector<std::string> notes;
        for (const auto& item : batch.items) notes.push_back(item.note);
        return notes;
      }, "Per item: why it was left to Pillow, or why a slower route was taken (empty: neither).");

  py::class_<ImageBatchDecoder, std::shared_ptr<ImageBatchDecoder>>(
      module, "ImageBatchDecoder",
      "Reads, scans and decodes batches of JPEG files or bytes with Pillow's libjpeg (and plain PNGs with zlib) on "
      "a pool of native threads (made once, reused), without the GIL.")
      .def(py::init<int, std::string>(), py::arg("threads"), py::arg("library_path"))
      .def_property_readonly("threads", &ImageBatchDecoder::threads)
      .def_property_readonly("failure", &ImageBatchDecoder::failure,
                             "Why the libjpeg cannot be used (empty: it can).")
      .def("scan", [](ImageBatchDecoder& decoder, const py::list& items, int64_t mode, int64_t max_pixels,
                      const std::vector<int64_t>& exact) {
        TORCH_CHECK(mode >= 0 && mode <= 2, "mode must be 0 (pixels), 1 (coefficients) or 2 (encoded)");
        // A tuple of the items: the bytes objects stay alive with the batch, whatever becomes of the list. Their
        // bytes are viewed, not copied (a copy here ran with the GIL held, 84 kB a one-JPEG request).
        py::tuple held(items);
        std::vector<DecodeSource> sources(held.size());
        for (size_t i = 0; i < sources.size(); ++i) {
          const py::handle item = held[i];
          if (py::isinstance<py::str>(item)) {
            sources[i].is_path = true;
            sources[i].path = item.cast<std::string>();
          } else if (PyBytes_Check(item.ptr())) {
            sources[i].bytes = std::string_view(PyBytes_AS_STRING(item.ptr()),
                                                static_cast<size_t>(PyBytes_GET_SIZE(item.ptr())));
          } else {
            TORCH_CHECK(false, "item ", i, " must be a str path or bytes");
          }
        }
        std::shared_ptr<ScannedBatch> batch;
        {
          py::gil_scoped_release released;
          batch = decoder.scan(std::move(sources), static_cast<ScanMode>(mode), max_pixels, exact);
        }
        batch->sources = hold(std::move(held));
        return batch;
      }, "Read and scan every input (str: a path; bytes: the encoded image); the items at the positions in `exact` "
         "as mode 1 (coefficients) whatever `mode` says.", py::arg("items"), py::arg("mode"), py::arg("max_pixels"),
           py::arg("exact") = std::vector<int64_t>{})
      .def("decode", [](ImageBatchDecoder& decoder, const ScannedBatch& batch, const at::Tensor& pixels,
                        const at::Tensor& pixel_offsets, const at::Tensor& coefficients,
                        const at::Tensor& coefficient_offsets, bool split_jpegs,
                        const std::optional<at::Tensor>& open_counter, int64_t open_ticket) {
        check_host_bytes(pixels, "pixels");
        check_host_bytes(coefficients, "coefficients");
        const int64_t* pixel_at = offsets_of(pixel_offsets, batch.items.size(), "pixel_offsets");
        const int64_t* coefficient_at = offsets_of(coefficient_offsets, batch.items.size(), "coefficient_offsets");
        int64_t* counter = nullptr;
        if (open_counter.has_value()) {
          TORCH_CHECK(!open_counter->is_cuda() && open_counter->scalar_type() == at::kLong &&
                          open_counter->numel() >= 1 && open_counter->is_contiguous(),
                      "open_counter must be a contiguous int64 host tensor");
          counter = open_counter->data_ptr<int64_t>();
        }
        py::gil_scoped_release released;
        std::vector<std::string> declined;
        try {
          declined = decoder.decode(batch, pixels.data_ptr<uint8_t>(), pixels.numel(), pixel_at,
                                    coefficients.data_ptr<uint8_t>(), coefficients.numel(), coefficient_at,
                                    split_jpegs);
        } catch (...) {
          if (counter != nullptr) open_host_counter(counter, open_ticket);
          throw;
        }
        // Opened here, before the GIL is taken back: the thread waiting behind the gate may hold it.
        if (counter != nullptr) open_host_counter(counter, open_ticket);
        return declined;
      }, "Decode the pixel and coefficient items into the buffers at their offsets (-1: skip); per item why not "
         "(empty: written). split_jpegs: a batch of few coefficient items splits each one's entropy decode across "
         "the threads (the same coefficients). open_counter: a host gate's counter, raised to open_ticket once "
         "the buffers are written (or the decode failed), without the GIL.", py::arg("batch"), py::arg("pixels"),
           py::arg("pixel_offsets"), py::arg("coefficients"), py::arg("coefficient_offsets"),
           py::arg("split_jpegs") = true, py::arg("open_counter") = py::none(), py::arg("open_ticket") = 0)
      .def("split_totals", [](const ImageBatchDecoder& decoder) {
        const ImageBatchDecoder::SplitTotals totals = decoder.split_totals();
        py::dict out;
        out["split"] = totals.split;
        out["declined"] = totals.declined;
        out["pieces"] = totals.pieces;
        out["decoded_again"] = totals.decoded_again;
        out["last_declined"] = totals.last_declined;
        return out;
      }, "Since the decoder was made: JPEGs whose entropy decode was split, splits declined (decoded by libjpeg "
         "instead), their pieces, pieces decoded again from the true start, and the last reason a split was declined.");
}

}  // namespace clip_flash
