// Working memory of the backends, counted. Every temporary buffer a backend allocates for a call
// goes through Scratch<T> (host) or cuda::DeviceScratch (device), so that the program can report
// the peak extra memory of a call (the flash path's stays flat in N, the standard path's grows as
// N²) from the allocations themselves.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace flashattn::detail {

struct ScratchCounter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
};
ScratchCounter& host_scratch_counter();
ScratchCounter& device_scratch_counter();  // the CUDA backend's temporary device buffers

inline void count_alloc(ScratchCounter& c, int64_t bytes) {
  const int64_t now = c.current.fetch_add(bytes) + bytes;
  int64_t seen = c.peak.load();
  while (now > seen && !c.peak.compare_exchange_weak(seen, now)) {
  }
}
inline void count_free(ScratchCounter& c, int64_t bytes) { c.current.fetch_sub(bytes); }

// Peak bytes of scratch held at once since the last reset.
inline int64_t scratch_peak(ScratchCounter& c) { return c.peak.load(); }
inline void reset_scratch_peak(ScratchCounter& c) { c.peak.store(c.current.load()); }

// An owning, 64-byte aligned, counted host buffer of n elements (uninitialized).
template <class T>
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(size_t n) { allocate(n); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr, o.size_ = 0; }
  ~Scratch() { release(); }

  void allocate(size_t n) {
    release();
    if (n == 0) return;
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
    size_ = n;
    count_alloc(host_scratch_counter(), int64_t(bytes));
  }
  void release() {
    if (!data_) return;
    count_free(host_scratch_counter(), int64_t((size_ * sizeof(T) + 63) / 64 * 64));
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace flashattn::detail
